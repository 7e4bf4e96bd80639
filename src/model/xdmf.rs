//! XDMF sidecar for grid models, so that ParaView and VisIt open model.h5's fields directly.
//!
//! The axis order is the classic trap. XDMF (like HDF5) lists array dimensions slowest first, so
//! a C-ordered dataset of shape `[nz][ny][nx]` is `Dimensions="nz ny nx"`. The `3DCoRectMesh`
//! topology counts *points* (`nz+1 ny+1 nx+1`) and the fields are cell-centred. For
//! `ORIGIN_DXDYDZ` geometry the origin and spacing are also read slowest axis first, i.e. in
//! z y x order (VTK's vtkXdmfReader sets `ORIGIN = (origin[2], origin[1], origin[0])`), despite the
//! name. We write both in z y x order.

use std::path::Path;

use crate::error::Result;
use crate::grid::Grid;
use crate::io::write_atomic;
use crate::model::spec::ModelSpec;

/// The /model fields of a grid model file that the XDMF lists.
pub fn grid_fields(
    spec: &ModelSpec,
    coverage: bool,
    var: bool,
) -> Vec<(&'static str, &'static str)> {
    let mut f = vec![
        ("velocity", "Float"),
        ("slowness", "Float"),
        ("reference_velocity", "Float"),
        ("perturbation", "Float"),
        ("slowness_perturbation", "Float"),
        ("solution", "Float"),
    ];
    if coverage {
        f.push(("hit_count", "UInt"));
        f.push(("dws", "Float"));
    }
    if var {
        f.push(("std_error_lower_bound", "Float"));
    }
    if spec.true_model.is_some() {
        f.push(("true_velocity", "Float"));
        f.push(("true_perturbation", "Float"));
    }
    f
}

fn escape(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

/// XDMF text for `fields` of /model in `h5_name` (a path relative to the XDMF file).
pub fn xdmf_text(h5_name: &str, g: &Grid, fields: &[(&str, &str)]) -> String {
    let [nx, ny, nz] = g.n;
    let mut s = String::new();
    s.push_str("<?xml version=\"1.0\" ?>\n<!DOCTYPE Xdmf SYSTEM \"Xdmf.dtd\" []>\n");
    s.push_str("<Xdmf Version=\"2.0\">\n <Domain>\n");
    s.push_str("  <Grid Name=\"seistomo_model\" GridType=\"Uniform\">\n");
    s.push_str(&format!(
        "   <!-- points in z y x order; cells are {nz} x {ny} x {nx} (z y x); axes x={}, y={}, z={} ({}) -->\n",
        escape(&g.axes[0]),
        escape(&g.axes[1]),
        escape(&g.axes[2]),
        escape(&g.units)
    ));
    s.push_str(&format!(
        "   <Topology TopologyType=\"3DCoRectMesh\" Dimensions=\"{} {} {}\"/>\n",
        nz + 1,
        ny + 1,
        nx + 1
    ));
    s.push_str("   <Geometry GeometryType=\"ORIGIN_DXDYDZ\">\n");
    s.push_str(&format!(
        "    <DataItem Name=\"Origin\" Dimensions=\"3\" NumberType=\"Float\" Precision=\"8\" Format=\"XML\">{:e} {:e} {:e}</DataItem>\n",
        g.origin[2], g.origin[1], g.origin[0]
    ));
    s.push_str(&format!(
        "    <DataItem Name=\"Spacing\" Dimensions=\"3\" NumberType=\"Float\" Precision=\"8\" Format=\"XML\">{:e} {:e} {:e}</DataItem>\n",
        g.spacing[2], g.spacing[1], g.spacing[0]
    ));
    s.push_str("   </Geometry>\n");
    for (name, ty) in fields {
        let prec = if *ty == "UInt" { 4 } else { 8 };
        s.push_str(&format!(
            "   <Attribute Name=\"{name}\" AttributeType=\"Scalar\" Center=\"Cell\">\n    <DataItem Dimensions=\"{nz} {ny} {nx}\" NumberType=\"{ty}\" Precision=\"{prec}\" Format=\"HDF\">{}:/model/{name}</DataItem>\n   </Attribute>\n",
            escape(h5_name)
        ));
    }
    s.push_str("  </Grid>\n </Domain>\n</Xdmf>\n");
    s
}

/// Write the XDMF sidecar atomically.
pub fn write_xdmf(path: &Path, h5_name: &str, g: &Grid, fields: &[(&str, &str)]) -> Result<()> {
    let text = xdmf_text(h5_name, g, fields);
    write_atomic(path, |w| w.write_all(text.as_bytes()))
}
