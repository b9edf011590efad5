"""Catalog files: the built-in ones load; each kind of mistake is one clear error."""

import shutil
from pathlib import Path

import pytest

from peak_tune.catalog.loaders import load_device, load_spec, load_transformation
from peak_tune.catalog.resolve import Catalog
from peak_tune.core import VendorCall, vendor_call
from peak_tune.errors import CatalogError, UserError

GOOD = """---
id: demo-step
version: 2
title: A demo step
summary: Demo.
kernels: [matmul]
backends: [c]
requires: []
conflicts: []
params:
  TILE: [8, 16]
constraints: ["TILE >= 8"]
passes:
  - region: device
  - region: launch
---
## Pass 1: device
Do the device part with TILE.

## Pass 2: launch
Do the launch part.
"""


def write(folder: Path, name: str, text: str) -> Path:
    path = folder / name
    path.write_text(text)
    return path


def test_builtin_catalog_loads():
    catalog = Catalog.with_user_folders()
    spec = catalog.spec("matmul")
    assert spec.size_symbols == ("M", "N", "K")
    assert "c" in spec.sources and "for" in spec.sources["c"]
    assert [s.label() for s in spec.check_sizes] == ["67x53x97", "257x293x331"]
    assert {"cpu", "h200", "mi250", "a6000", "adreno-x1-85"} <= set(catalog.devices)
    assert catalog.device("h200").peak_gflops["float32"] == 67000


def test_transformation_parses_passes_and_params(tmp_path):
    t = load_transformation(write(tmp_path, "demo-step.md", GOOD))
    assert t.id == "demo-step" and t.version == 2
    assert [p.region for p in t.passes] == ["device", "launch"]
    assert t.passes[0].text == "Do the device part with TILE."
    assert t.params[0].name == "TILE" and t.params[0].values == (8, 16)
    assert t.text_hash() != load_transformation(
        write(tmp_path, "demo-step.md", GOOD.replace("launch part", "other part"))).text_hash()


@pytest.mark.parametrize(
    ("change", "field"),
    [
        (("version: 2", "version: two"), "version"),
        (("title: A demo step\n", ""), "title"),
        (("summary: Demo.", "summery: Demo."), "summery"),
        (("TILE: [8, 16]", "tile: [8, 16]"), "params.tile"),
        (("TILE: [8, 16]", "TILE: []"), "params.TILE"),
        (('["TILE >= 8"]', '["TILE >= SIZE"]'), "constraints[0]"),
        (("  - region: launch\n", "  - region: host\n"), "passes[1].region"),
        (("## Pass 2: launch", "## Notes"), "passes"),
        (("id: demo-step", "id: other-step"), "id"),
        (("kernels: [matmul]", "kernels: [matmul"), "front matter"),
        (("constraints:", "defaults: {TILE: 12}\nconstraints:"), "defaults.TILE"),
        (("constraints:", "defaults: {SIZE: 8}\nconstraints:"), "defaults.SIZE"),
        (("constraints:", "dtypes: [float128]\nconstraints:"), "dtypes[0]"),
        (("constraints:", "dtypes: float16\nconstraints:"), "dtypes"),
    ],
)
def test_malformed_transformation_names_file_and_field(tmp_path, change, field):
    path = write(tmp_path, "demo-step.md", GOOD.replace(*change))
    with pytest.raises(CatalogError) as info:
        load_transformation(path)
    assert info.value.field == field
    assert str(path) in str(info.value)
    assert "\n" not in str(info.value)


def test_declared_default_else_first_value(tmp_path):
    plain = load_transformation(write(tmp_path, "demo-step.md", GOOD))
    assert plain.default_value("TILE") == (8, False)
    text = GOOD.replace("constraints:", "defaults: {TILE: 16}\nconstraints:")
    declared = load_transformation(write(tmp_path, "demo-step.md", text))
    assert declared.default_value("TILE") == (16, True)
    assert declared.text_hash() == plain.text_hash()  # a default changes no application


def test_missing_front_matter(tmp_path):
    with pytest.raises(CatalogError, match="front matter"):
        load_transformation(write(tmp_path, "x.md", "# just text\n"))


def test_user_catalog_adds_and_checks_transformations(tmp_path):
    write(tmp_path, "demo-step.md", GOOD)
    catalog = Catalog.with_user_folders([str(tmp_path)])
    assert "demo-step" in catalog.transformations
    write(tmp_path, "broken.md", GOOD.replace("id: demo-step", "id: broken").replace(
        "requires: []", "requires: [no-such-step]"))
    with pytest.raises(CatalogError, match="broken.md: requires: unknown transformation"):
        _ = Catalog.with_user_folders([str(tmp_path)]).transformations


def test_unknown_names_are_user_errors(tmp_path):
    catalog = Catalog.with_user_folders()
    with pytest.raises(UserError, match="unknown kernel 'conv'"):
        catalog.spec("conv")
    with pytest.raises(UserError, match="unknown device 'tpu9'"):
        catalog.device("tpu9")
    with pytest.raises(UserError, match="does not exist"):
        Catalog.with_user_folders([str(tmp_path / "nope")])


def test_malformed_spec_and_device(tmp_path):
    seed = tmp_path / "seeds" / "bad"
    seed.mkdir(parents=True)
    (seed / "naive.c").write_text("void f(void) {}\n")
    (seed / "naive.cu").write_text('extern "C" __global__ void f() {}\n')
    (seed / "naive.hip").write_text('extern "C" __global__ void f() {}\n')
    (seed / "naive.hlsl").write_text("[numthreads(1, 1, 1)] void main() {}\n")
    good = (Path(__file__).parents[2] / "seeds" / "matmul" / "spec.toml").read_text()
    (seed / "spec.toml").write_text(good.replace('flops = "2 * M * N * K"', 'flops = "2 * M * Q"'))
    with pytest.raises(CatalogError, match=r"spec.toml: flops: unknown name"):
        load_spec(seed)
    (seed / "spec.toml").write_text(good.replace('intent = "out"', 'intent = "sideways"'))
    with pytest.raises(CatalogError, match=r"args\[2\].intent"):
        load_spec(seed)
    (seed / "spec.toml").write_text("name = [")
    with pytest.raises(CatalogError, match="not valid TOML"):
        load_spec(seed)
    device = write(tmp_path, "gpu9.toml", 'name = "gpu9"\ntitle = "x"\nbackend = "c"\n'
                   'memory_bandwidth_gbs = "fast"\n[peak_gflops]\n')
    with pytest.raises(CatalogError, match="memory_bandwidth_gbs: expected"):
        load_device(device)


def test_element_types_narrow_the_transformations_of_a_study():
    catalog = Catalog.with_user_folders()
    assert catalog.transformation("tensor-core").dtypes == ("float16", "bfloat16")
    every = {t.id for t in catalog.transformations_for("matmul", "cuda")}
    fp32 = {t.id for t in catalog.transformations_for("matmul", "cuda", "float32")}
    fp16 = {t.id for t in catalog.transformations_for("matmul", "cuda", "float16")}
    tensor = {"tensor-core", "tensor-tiling", "ldmatrix", "wgmma", "warp-specialize",
              "address-hoisting", "tma", "persistent", "register-budget", "cluster-multicast",
              "tma-store", "ping-pong", "stream-k"}
    assert fp16 == every and fp32 == every - tensor
    assert catalog.element_types("warp-specialize") == ("bfloat16", "float16")
    assert catalog.element_types("block-swizzle") == ("bfloat16", "float16", "float32",
                                                      "float64")


def test_a_transformation_that_requires_one_left_out_is_left_out(tmp_path):
    write(tmp_path, "demo-step.md", GOOD.replace("constraints:", "dtypes: [float16]\nconstraints:"))
    write(tmp_path, "after-demo.md", GOOD.replace("id: demo-step", "id: after-demo").replace(
        "requires: []", "requires: [demo-step]"))
    catalog = Catalog.with_user_folders([str(tmp_path)])
    assert {"demo-step", "after-demo"} <= {t.id for t in catalog.transformations_for(
        "matmul", "c", "float16")}
    assert not {"demo-step", "after-demo"} & {t.id for t in catalog.transformations_for(
        "matmul", "c", "float32")}


@pytest.mark.parametrize(("vendor", "message"), [
    ('cuda = "cublas"\nc = "gemm"', r"vendor.cuda: 'cublas' is not one of gemm, gemm-bt, "
                                   r"reference, none"),
    ('cuda = "reference"\nc = "gemm"', r"vendor.cuda: numpy's reference runs on the CPU "
                                      r"\(c\) only"),
    ('c = "gemm-bt"', r"vendor.c: gemm-bt needs shapes A \[.., M, K\], B \[.., N, K\], C "
                      r"\[.., M, N\] \(found A \['M', 'K'\], B \['K', 'N'\]"),
])
def test_a_vendor_call_the_kernel_cannot_make_is_a_catalog_error(tmp_path, vendor, message):
    """[vendor] names what each backend times as the baseline; a GEMM call is checked
    against the buffers' shapes before any run."""
    seed = tmp_path / "mine"
    shutil.copytree(Path(__file__).parents[2] / "seeds" / "matmul", seed)
    text = (seed / "spec.toml").read_text()
    (seed / "spec.toml").write_text(text.replace('c = "gemm"\ncuda = "gemm"\n', vendor + "\n", 1))
    with pytest.raises(CatalogError, match=message):
        load_spec(seed)


def test_vendor_calls_default_to_numpy_on_the_cpu_and_none_on_a_gpu(tmp_path):
    seed = tmp_path / "mine"
    shutil.copytree(Path(__file__).parents[2] / "seeds" / "matmul", seed)
    text = (seed / "spec.toml").read_text()
    (seed / "spec.toml").write_text(text[:text.index("[vendor]")]
                                    + text[text.index("[[args]]"):])
    spec = load_spec(seed)
    assert spec.vendor == {}
    assert [vendor_call(spec, b) for b in ("c", "cuda", "hip", "hlsl")] == [
        VendorCall.REFERENCE, VendorCall.NONE, VendorCall.NONE, VendorCall.NONE]
    builtin = Catalog.with_user_folders().spec("matmul")
    assert vendor_call(builtin, "cuda") is VendorCall.GEMM
