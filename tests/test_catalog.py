"""The catalog of attention implementations is the one place their names live: the schema's enums,
the presets, the study specs and the answers agree with it, dispatch is a lookup in it, and the rerun
hashes take an implementation's module from it."""

from __future__ import annotations

import ast
import functools
import importlib
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml

from cell_kwargs import cell_kwargs
from cs336sys import catalog
from cs336sys import studies as S
from cs336sys.catalog import BUILT_IN
from cs336sys.measure.session import Session
from cs336sys.models import attention as attn
from cs336sys.pipeline import plan
from cs336sys.pipeline.config import load_schema, validate_config
from cs336sys.rows import Skip
from workflow_helpers import REPO, load_config

PACKAGE = REPO / "src" / "cs336sys"
CPU = torch.device("cpu")


IMPL_STUDIES = [name for name, spec in S.STUDIES.items() if "impl" in spec.axes]  # the studies whose `impl` axis names an implementation


def _offered(study: str) -> tuple[str, ...]:
    """The implementations a study's `impl` axis offers: its kind's in the catalog."""
    return catalog.names(S.study(study).kind)


def _schema_impl_enum(study: str) -> list[str]:
    """The `impl` enum of a study's grid, following `$ref`s (the LM studies share `$defs/lm_impls`)."""
    schema = load_schema()
    node = schema["properties"][study]["properties"]["grid"]["properties"]["impl"]
    while "items" not in node:
        node = schema["$defs"][node["$ref"].rpartition("/")[2]]
    return node["items"]["enum"]


# ---------------------------------------------------------------- 1. every name the code and config use is declared


@pytest.mark.parametrize("study", IMPL_STUDIES)
def test_each_schema_impl_enum_is_the_catalog_of_its_study(study):
    enum = _schema_impl_enum(study)
    assert len(enum) == len(set(enum)), f"{study}: repeated names in the schema's impl enum"
    assert set(enum) == set(_offered(study)), (
        f"schema {study}.grid.impl enum {enum} differs from the catalog's {list(_offered(study))}: "
        "add the name to both (docs/adding-a-study.md, 'Adding an attention implementation')"
    )


def test_the_studies_with_an_impl_axis_are_those_of_the_catalogs_kinds():
    assert set(IMPL_STUDIES) == {name for name, spec in S.STUDIES.items() if spec.kind in catalog.KINDS}
    assert {S.study(name).kind for name in IMPL_STUDIES} == set(catalog.KINDS)  # every kind has a study


def test_the_attention_study_says_which_impl_activation_pairs_exist():
    why = S.study("attention").why_invalid
    # "(valid: eager, compiled, triton × softmax, relu; sdpa × softmax)": each impl once, with its activations
    groups = [group.split(" × ") for group in why.rpartition("(valid: ")[2].rstrip(")").split("; ")]
    offered = {name: tuple(acts.split(", ")) for names, acts in groups for name in names.split(", ")}
    assert sum(len(names.split(", ")) for names, _ in groups) == len(offered), why
    assert offered == {impl.name: impl.activations for impl in catalog.impls(catalog.CORE)}, why
    assert offered["sdpa"] == ("softmax",) and offered["triton"] == ("softmax", "relu"), why


def _presets() -> list[Path]:
    return [REPO / "config.yaml", *sorted((REPO / "config").rglob("*.yaml"))]


def test_presets_name_only_catalog_implementations():
    assert len(_presets()) > 3
    for path in _presets():
        config = yaml.safe_load(path.read_text()) or {}
        own = set((config.get("plugins") or {}).get("attention") or {})  # a preset's plug-ins join the impl axis
        for study in IMPL_STUDIES:
            section = config.get(study) or {}
            named = [*((section.get("grid") or {}).get("impl") or [])]
            unknown = sorted(set(named) - set(_offered(study)) - own)
            assert not unknown, f"{path.relative_to(REPO)}: {study}.grid.impl names {unknown}, not in the catalog for {study}"


def test_study_specs_pair_only_catalog_implementations():
    for name, spec in S.STUDIES.items():
        for pair in spec.pairs:
            if pair.axis == "impl":
                assert {pair.base, pair.other} <= set(_offered(name)), (name, pair)


IMPL_TOKEN = re.compile(r"(?<![\w.-])(?:triton|sdpa|tutorial)(?:-[a-z0-9]+)*(?![\w-])")  # sdpa-flash, triton-atomic…


def _mentions_impl(node: ast.AST) -> bool:
    return "impl" in ast.unparse(node)


def _strings(node: ast.AST) -> list[str]:
    """A string literal, or the string literals of a list, tuple or set display (not of an expression)."""
    items = node.elts if isinstance(node, (ast.List, ast.Tuple, ast.Set)) else [node]
    return [n.value for n in items if isinstance(n, ast.Constant) and isinstance(n.value, str)]


def impl_literals(source: str) -> set[str]:
    """The implementation names a module spells out.

    A name is: a Triton/SDPA/tutorial-like token in any string (``sdpa-flash`` in a hint too); a
    string compared with something about ``impl`` (``c.impl == "eager"``, ``{"eager", "compiled"} <=
    set(df["impl"])``); the value of an ``impl=`` keyword; an argument of a method of something about
    ``impl`` (``df["impl"].isin([...])``); a string argument after an ``"impl"`` argument
    (``paired_ratios(df, keys, "impl", "eager", "compiled")``).
    """
    found: set[str] = set()
    tree = ast.parse(source)
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            found |= set(IMPL_TOKEN.findall(node.value))
        elif isinstance(node, ast.Compare):
            sides = [node.left, *node.comparators]
            if any(_mentions_impl(side) for side in sides):
                found |= {s for side in sides for s in _strings(side) if s != "impl" and not _mentions_impl(side)}
        elif isinstance(node, ast.Call):
            found |= {s for kw in node.keywords if kw.arg == "impl" for s in _strings(kw.value)}
            if isinstance(node.func, ast.Attribute) and _mentions_impl(node.func.value):
                found |= {s for arg in node.args for s in _strings(arg)}
            axis = [i for i, a in enumerate(node.args) if isinstance(a, ast.Constant) and a.value == "impl"]
            if axis:
                found |= {s for arg in node.args[axis[0] + 1 :] for s in _strings(arg)}
    return found


def test_the_scanner_finds_implementation_names_however_written():
    source = (
        'x = df[df["impl"].isin(["triton", "sdpa-math"])]\n'
        'y = first(part, impl="warp")\n'
        'z = c.impl == "pallas" or {"eager", "fused"} <= set(df["impl"])\n'
        'r = paired_ratios(df, ["d_model"], "impl", "base", "other")\n'
        'hint = "`flash.grid.impl: [triton-atomic2, …]`, see models.triton_attention and triton.testing"\n'
        'ours = df["impl"].isin([i.name for i in impls("flash") if i.family in ("ours",)])\n'  # not literals
        'odd = df.groupby(["impl"]).filter(lambda g: {"fp32"} <= set(g["precision"]))\n'
    )
    assert impl_literals(source) == {"triton", "sdpa-math", "warp", "pallas", "eager", "fused", "base", "other", "triton-atomic2"}


def _answer_modules() -> list[Path]:
    # the answers to the handout's questions: their own package on top of the studies
    return sorted(PACKAGE.glob("handout/*.py"))


def test_the_answers_name_only_catalog_implementations():
    modules = _answer_modules()
    assert modules
    seen = {}
    for path in modules:
        for name in impl_literals(path.read_text()):
            seen.setdefault(name, path.relative_to(PACKAGE).as_posix())
    assert {"eager", "triton"} <= set(seen)  # the scanner sees the answers' names at all
    unknown = {name: where for name, where in seen.items() if name not in catalog.names()}
    assert not unknown, f"the answers name implementations the catalog lacks: {unknown}"


# ---------------------------------------------------------------- 2. dispatch is a catalog lookup


def test_every_catalog_entry_names_a_callable_of_its_module():
    for impl in catalog.impls():
        module = importlib.import_module(impl.module)  # the Triton ones import on CPU; they only run on CUDA
        for activation, attribute in impl.entry.items():
            assert callable(getattr(module, attribute, None)), f"{impl.name} × {activation}: {impl.module}.{attribute} is not a callable"


def _qkv():
    gen = torch.Generator().manual_seed(0)
    return [torch.randn(2, 1, 16, 8, generator=gen) for _ in range(3)]


@pytest.mark.parametrize("impl", [i for i in catalog.names() if not catalog.lookup(i).needs_cuda])
def test_every_cpu_implementation_resolves_and_matches_eager(impl):
    line = catalog.lookup(impl)
    q, k, v = _qkv()
    for activation in catalog.ACTIVATIONS:
        found = attn.resolve(impl, activation)
        if activation not in line.activations:
            assert found is None, (impl, activation)
            continue
        fn, context = found
        expected = attn.get_attention("eager", activation)(q, k, v, is_causal=True)
        if line.compile:  # compiling takes seconds: check what is compiled, not the compiled result
            assert fn._torchdynamo_orig_callable is getattr(attn, line.entry[activation])
            assert attn.resolve(impl, activation)[0] is fn  # compiled once per process
            continue
        with context():
            if impl in ("sdpa-cudnn", "sdpa-efficient"):  # the backend is forced: CPU has none of these two
                with pytest.raises(RuntimeError, match="No viable backend"):
                    fn(q, k, v, is_causal=True)
                continue
            torch.testing.assert_close(fn(q, k, v, is_causal=True), expected)


def test_triton_implementations_resolve_to_their_kernels_without_running():
    from cs336sys.models import triton_attention, triton_tutorial_attention

    fn, context = attn.resolve("triton")
    assert fn is triton_attention.flash_attention and attn.resolve("triton", "relu")[0] is triton_attention.relu_attention_fused
    atomic, _ = attn.resolve("triton-atomic")
    assert isinstance(atomic, functools.partial) and atomic.func is triton_attention.flash_attention
    assert atomic.keywords == {"atomic_dq": True}
    assert attn.resolve("tutorial")[0] is triton_tutorial_attention.tutorial_attention
    assert attn.resolve("triton-atomic", "relu") is None and attn.resolve("tutorial", "relu") is None


def test_flash_dispatch_skips_triton_on_cpu_and_forces_sdpa_backends(monkeypatch):
    from cs336sys.studies.flash.measure import _flash_fn

    monkeypatch.setenv("TRITON_INTERPRET", "0")
    for impl in ("triton", "triton-atomic", "tutorial"):
        with pytest.raises(Skip, match="needs CUDA"):
            _flash_fn(impl, CPU)
    fn, context = _flash_fn("sdpa-efficient", CPU)
    q, k, v = _qkv()
    fn(q, k, v)  # PyTorch picks a CPU backend…
    with context(), pytest.raises(RuntimeError, match="No viable backend"):
        fn(q, k, v)  # …unless the catalog's backend is forced


def test_flash_cells_and_measurement_follow_each_lines_unsupported_rule():
    grid = {"seq_len": [100, 128], "head_dim": [16, 64], "precision": ["bf16"], "impl": list(_offered("flash")), "num_heads": [1]}
    section = validate_config({"run": "t", "device": "cpu", "studies": ["flash"], "flash": {"grid": grid}})[0]["flash"]
    cells = {(c["impl"], c["seq_len"], c["head_dim"]) for c in plan.cells("flash", section, BUILT_IN)}
    runs = {
        (i.name, L, d) for i in catalog.impls(catalog.FUSED) for L in (100, 128) for d in (16, 64) if not i.why_unsupported(L, d, "bf16")
    }
    assert cells == runs and ("tutorial", 128, 64) in cells and ("tutorial", 100, 64) not in cells
    from cs336sys.studies.flash.measure import measure

    with pytest.raises(Skip, match="unsupported by the Triton tutorial kernel: seq_len 100"):
        next(measure(CPU, {}, Session(), **cell_kwargs("flash", seq_len=100, head_dim=64, precision="bf16", impl="tutorial")))


def test_unknown_names_are_refused_naming_the_allowed_ones():
    from cs336sys.studies.flash.measure import _flash_fn

    cores = catalog.names(catalog.CORE)
    assert cores[:4] == ("eager", "compiled", "sdpa", "triton")  # as variants.IMPLS listed them
    with pytest.raises(ValueError, match=f"unknown attention-core implementation 'nope'; known: {', '.join(cores)}$"):
        attn.get_attention("nope")
    with pytest.raises(ValueError, match="unknown attention-core implementation 'triton-atomic'"):
        attn.get_attention("triton-atomic")  # a flash implementation, not a core of the attention study
    with pytest.raises(
        ValueError, match=r"unknown fused-attention implementation 'sdpa-math'; known: .*triton-atomic, tutorial, sdpa-flash"
    ):
        _flash_fn("sdpa-math", CPU)
    with pytest.raises(ValueError, match=f"unknown lm implementation 'compiled'; known: {', '.join(catalog.names(catalog.LM))}$"):
        catalog.lookup("compiled", catalog.LM)
    with pytest.raises(ValueError, match="unknown kind of study 'e2e'; known: lm, attention-core, fused-attention$"):
        catalog.names("e2e")  # a study's name where its kind belongs would offer nothing, unseen


def test_the_lm_kind_runs_cores_of_the_attention_core_kind():
    # TransformerLM asks get_attention, which serves the attention cores' names, for its softmax core
    assert set(catalog.names(catalog.LM)) <= set(catalog.names(catalog.CORE))
    assert all("softmax" in i.activations for i in catalog.impls(catalog.LM))
    lm = [name for name, spec in S.STUDIES.items() if spec.kind == catalog.LM]
    assert {"e2e", "warmup", "profile", "memory"} <= set(lm)  # each offers the LM kind's implementations
    assert all(_offered(name) == catalog.names(catalog.LM) for name in lm)


def test_the_mha_studys_exact_variants_run_cores_the_catalog_serves():
    # mha names its cores by catalog name (variants.MHA_CORES); a name the catalog lacks would drop the
    # core's line from the cells' rerun hash (studies.cell_entries keeps catalog names only) in silence
    from cs336sys.models.variants import MHA_CORES, MHA_VARIANTS

    assert set(MHA_CORES) <= set(MHA_VARIANTS)
    assert set(MHA_CORES.values()) <= set(catalog.names(catalog.CORE))
    assert plan.cell_entries("mha", {"variant": "exact-sdpa"}, BUILT_IN) == ("sdpa",)


def test_the_answers_split_ours_from_pytorchs_by_family():
    ours = {i.name for i in catalog.impls(catalog.FUSED) if i.family in ("ours", "reference")}
    assert {"triton", "triton-atomic", "tutorial"} <= ours  # the list the answers spelled out before the catalog
    assert not ours & {"eager", "compiled", "sdpa-flash", "sdpa-cudnn", "sdpa-efficient"}


@pytest.mark.slow
def test_the_catalog_imports_without_torch():
    code = "import sys, cs336sys.catalog, cs336sys.models.variants; assert 'torch' not in sys.modules, 'torch imported'"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]


# ---------------------------------------------------------------- 3. registering an implementation


def _toy(name: str = "scratch-toy", **changes) -> catalog.Impl:
    entry, kinds = {"softmax": "softmax_attention"}, (catalog.CORE, catalog.FUSED)
    fields = dict(name=name, family="ours", module="cs336sys.models.attention", entry=entry, kinds=kinds, about="a toy")
    return catalog.Impl(**{**fields, **changes})


@pytest.fixture
def scratch_catalog(monkeypatch):
    """Registrations are dropped after the test."""
    before = dict(catalog._IMPLS)
    yield
    catalog._IMPLS.clear()
    catalog._IMPLS.update(before)
    attn._callable.cache_clear()


def test_register_refuses_a_name_declared_already(scratch_catalog):
    with pytest.raises(ValueError, match="'eager' is declared already .*cs336sys.models.attention.*pick another name"):
        catalog.register(_toy("eager"))
    catalog.register(_toy())
    with pytest.raises(ValueError, match="'scratch-toy' is declared already"):
        catalog.register(_toy(module="elsewhere"))


def test_register_refuses_a_line_naming_unknown_things(scratch_catalog):
    for changes, message in [
        ({"family": "theirs"}, "family 'theirs' .allowed: ours, pytorch, reference"),
        ({"kinds": ("attention-layer",)}, r"kinds \['attention-layer'\] .allowed: one or more of lm, attention-core, fused-attention"),
        ({"entry": {"gelu": "f"}}, r"entry activations \['gelu'\]"),
        ({"entry": {"relu": "relu_attention"}}, "no softmax entry"),
        ({"name": "Toy_1"}, "name 'Toy_1'"),
    ]:
        with pytest.raises(ValueError, match=message):
            catalog.register(_toy(**changes))
    assert "scratch-toy" not in catalog.names()


def test_a_registered_implementation_is_offered_dispatched_and_hashed(scratch_catalog):
    from cs336sys.studies.flash.measure import _flash_fn

    toy = catalog.register(_toy(module="cs336sys.models.performer", entry={"softmax": "performer_attention"}))
    assert _offered("flash")[-1] == "scratch-toy" and "scratch-toy" in _offered("attention")
    assert "scratch-toy" not in _offered("e2e")
    from cs336sys.models.performer import performer_attention

    assert _flash_fn("scratch-toy", CPU)[0] is performer_attention
    axes = {"seq_len": 64, "head_dim": 16, "precision": "fp32", "num_heads": 1}
    offered = BUILT_IN.plus([toy])  # the line as a config's view holds it: planning asks the view, not the process
    assert "cs336sys.models.performer" in plan.cell_modules("flash", {**axes, "impl": "scratch-toy"}, offered)
    assert "cs336sys.models.performer" not in plan.cell_modules("flash", {**axes, "impl": "eager"}, offered)


# ---------------------------------------------------------------- 4. code hashes: the same modules as before the catalog

# What each cell hashed of these modules before the catalog derived the optional modules (captured by
# running the per-study `optional_modules` rules of a9427d7 over every cell of config/full.yaml, and
# over one cell per schema implementation of each study): study:impl (or mha's variant) → modules.
WATCHED = (
    "cs336sys.models.attention",
    "cs336sys.models.triton_attention",
    "cs336sys.models.triton_tutorial_attention",
    "cs336sys.models.performer",
    "cs336sys.models.variants",
)
_CORES = ("cs336sys.models.attention", "cs336sys.models.variants")
_OURS = ("cs336sys.models.attention", "cs336sys.models.triton_attention", "cs336sys.models.variants")
BEFORE = {
    **{f"{s}:{i}": _CORES for s in ("e2e", "warmup", "profile", "memory", "attention") for i in ("eager", "sdpa")},
    **{f"{s}:triton": _OURS for s in ("e2e", "warmup", "profile", "memory", "attention")},
    "attention:compiled": _CORES,
    **{f"flash:{i}": _CORES for i in ("eager", "compiled", "sdpa-flash", "sdpa-cudnn", "sdpa-efficient")},
    "flash:triton": _OURS,
    "flash:triton-atomic": _OURS,
    "flash:tutorial": ("cs336sys.models.attention", "cs336sys.models.triton_tutorial_attention", "cs336sys.models.variants"),
    # since the catalog, exact mha cells no longer hash Performer's module (models.mha imports it lazily)
    "mha:exact-eager": ("cs336sys.models.attention", "cs336sys.models.variants"),
    "mha:exact-sdpa": ("cs336sys.models.attention", "cs336sys.models.variants"),
    "mha:performer": ("cs336sys.models.performer", "cs336sys.models.variants"),
    # precision hashed models.variants only through the other studies' packages, which the registry
    # imported for every cell then: its cells go by the rule for a study added since (below)
}


def _every_cell():
    config, _ = validate_config(load_config(REPO, "config/full.yaml"))
    for study in config["studies"]:
        cells = plan.cells(study, config[study], BUILT_IN)
        yield from ((study, axes) for axes in cells)
        if "impl" in S.study(study).axes:  # and each implementation the schema allows, on a shape it runs
            for impl in _schema_impl_enum(study):
                axes = {**cells[0], "impl": impl, "activation": "softmax"} if study == "attention" else {**cells[0], "impl": impl}
                if study == "flash":
                    axes.update(seq_len=1024, head_dim=64, precision="bf16")
                yield study, {k: v for k, v in axes.items() if k in S.study(study).axes}


def test_every_cell_hashes_the_same_implementation_modules_as_before_the_catalog():
    checked = set()
    for study, axes in _every_cell():
        key = f"{study}:{axes.get('impl', axes.get('variant', '-'))}"
        if key not in BEFORE:  # a study or implementation added since: the modules of the lines it runs, no other kernel's
            hashed = set(plan.cell_modules(study, axes, BUILT_IN))
            runs = {catalog.lookup(impl).module for impl in plan.cell_entries(study, axes, BUILT_IN)}
            kernels = {i.module for i in catalog.impls()} - {"cs336sys.models.attention"}  # the cores: a plain import
            assert runs <= hashed and not (hashed & kernels) - runs, f"{key}: hashes {sorted(hashed & kernels)}, runs {sorted(runs)}"
            if "impl" in S.study(study).axes:
                assert catalog.lookup(axes["impl"]).module in hashed, key
            continue
        hashed = tuple(m for m in WATCHED if m in plan.cell_modules(study, axes, BUILT_IN))
        assert hashed == BEFORE[key], f"{study} cell {S.cell_id(study, axes)} hashes {hashed}, before {BEFORE[key]}"
        checked.add(key)
    assert checked == set(BEFORE)
