//! What goes into model files: what the unknowns mean ([`spec`]), derived fields ([`fields`]),
//! the HDF5 model file and its XDMF sidecar ([`hdf5`], [`xdmf`], [`cf`] for netCDF readers),
//! provenance, report.json ([`report`]), the checkpoint file format, PNG quicklooks ([`plot`])
//! the L-curve's corner ([`lcurve`]) and the other rules that choose a weight ([`weight`]). The pipeline decides when they are written.

pub mod cf;
pub mod checkpoint;
pub mod fields;
pub mod hdf5;
pub mod lcurve;
pub mod plot;
pub mod provenance;
pub mod report;
pub mod resolution;
pub mod spec;
pub mod weight;
pub mod xdmf;
