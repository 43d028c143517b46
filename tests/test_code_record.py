"""A rerun names the files whose edit invalidated its cells (pipeline.code_record)."""

from __future__ import annotations

from cs336sys.columns import stat_columns
from cs336sys.pipeline.code_record import changed_files, file_hashes, read_record, record_path, rerun_notes, write_record


def test_changed_files_lists_edited_added_and_dropped_files():
    before = {"models/attention.py": "a", "models/mha.py": "b", "models/performer.py": "c"}
    now = {"models/attention.py": "a", "models/mha.py": "B", "measure/timing.py": "d"}
    assert changed_files(before, now) == ["measure/timing.py", "models/mha.py", "models/performer.py"]
    assert changed_files(before, before) == []


def test_file_hashes_name_files_relative_to_the_package_and_follow_content():
    hashes = file_hashes(["cs336sys.models.variants", "cs336sys.pipeline.code_record", "cs336sys.no_such_module"])
    assert set(hashes) == {"models/variants.py", "pipeline/code_record.py"}
    assert all(len(h) == 16 for h in hashes.values())


def test_notes_group_cells_by_the_files_that_changed(tmp_path):
    current = {"models/attention.py": "new", "models/mha.py": "m"}
    cells = []
    for i, (study, attention) in enumerate([("mha", "old"), ("mha", "old"), ("e2e", "old"), ("e2e", "new")]):
        out = tmp_path / f"{study}-{i}.csv"
        write_record(out, {"models/attention.py": attention, "models/mha.py": "m"})
        cells.append((study, out, current))
    cells.append(("e2e", tmp_path / "never-measured.csv", current))  # no record: says nothing
    notes = rerun_notes(cells)
    assert notes == ["code changed since these cells were measured: models/attention.py → 1 e2e cell job, 2 mha cell jobs rerun"]


def test_a_broken_record_explains_nothing_and_does_not_raise(tmp_path):
    out = tmp_path / "cell.csv"
    record_path(out).write_text("{not json")
    assert read_record(out) is None
    assert rerun_notes([("e2e", out, {"a.py": "1"})]) == []


def test_a_cells_record_names_the_catalog_lines_it_runs_not_the_whole_catalog():
    hashes = file_hashes(["cs336sys.catalog", "cs336sys.columns", "cs336sys.models.variants"], ["triton"])
    statistics = {f"columns.py:{name}" for name in stat_columns()}  # the measuring process computes them: in every record
    assert set(hashes) == {"catalog.py", "catalog.py:triton", "columns.py", "models/variants.py", *statistics}
    assert file_hashes(["cs336sys.catalog"], ["triton"])["catalog.py"] != file_hashes(["cs336sys.catalog"])["catalog.py"]  # machinery only
    assert set(file_hashes(["cs336sys.catalog"])) == {"catalog.py"}  # without entries: whole files, as the report's jobs hash them
