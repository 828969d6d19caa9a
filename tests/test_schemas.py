"""The JSON Schemas editors read are the ones patchkit decodes with, and they accept every real file of
this repository and reject what patchkit rejects (an unknown key, a wrong type)."""

from __future__ import annotations

import json
import tomllib
from pathlib import Path

import jsonschema
import pytest

from patchkit.cli.schemas import rendered

REPO = Path(__file__).resolve().parents[1]
FILES = {"patch.schema.json": "patches/*/patch.toml", "series.schema.json": "patches/series.toml",
         "image.schema.json": "images/*/image.toml", "variant.schema.json": "images/*/variant.toml"}


def test_committed_schemas_are_generated_from_the_schema_classes():
    committed = {p.name: p.read_text() for p in (REPO / "schemas").glob("*.schema.json")}
    assert committed == rendered(), "run `patchkit schemas --write`"


@pytest.mark.parametrize("schema_name", sorted(FILES))
def test_every_real_file_validates_against_its_schema(schema_name):
    schema = json.loads((REPO / "schemas" / schema_name).read_text())
    files = sorted(REPO.glob(FILES[schema_name]))
    assert files
    for path in files:
        jsonschema.validate(tomllib.loads(path.read_text()), schema)


@pytest.mark.parametrize("schema_name", sorted(FILES))
def test_an_unknown_key_fails_the_editor_schema_too(schema_name):
    schema = json.loads((REPO / "schemas" / schema_name).read_text())
    doc = tomllib.loads(sorted(REPO.glob(FILES[schema_name]))[0].read_text())
    with pytest.raises(jsonschema.ValidationError, match="colour"):
        jsonschema.validate({**doc, "colour": "red"}, schema)


def test_taplo_maps_each_file_kind_to_its_schema():
    rules = tomllib.loads((REPO / ".taplo.toml").read_text())["rule"]
    mapped = {Path(r["schema"]["path"]).name: r["include"][0] for r in rules}
    assert mapped == FILES
