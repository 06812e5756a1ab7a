"""docs/configuration.md is generated from the schema (specbuild.config.schema_doc): the committed
page is what the schema renders, and a schema change makes it stale."""

from pathlib import Path

import yaml
from config_cases import REPO, SCHEMA

from specbuild.config import schema_doc


def test_the_configuration_page_is_the_schemas():
    page = (REPO / "docs" / "configuration.md").read_text(encoding="utf-8")
    assert page == schema_doc.render(SCHEMA), f"run: {schema_doc.REGENERATE}"
    assert schema_doc.main(["--check", str(REPO / "docs" / "configuration.md")]) == 0


def test_a_schema_change_makes_the_page_stale(tmp_path: Path):
    schema = yaml.safe_load(SCHEMA.read_text(encoding="utf-8"))
    schema["properties"]["train"]["properties"]["lr"]["description"] = "Changed."
    changed = tmp_path / "schema.yaml"
    changed.write_text(yaml.safe_dump(schema), encoding="utf-8")
    assert "| Changed. |" in schema_doc.render(changed)
    assert (
        schema_doc.main(
            ["--schema", str(changed), "--check", str(REPO / "docs" / "configuration.md")]
        )
        == 1
    )
