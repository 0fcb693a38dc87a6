"""The browser libraries the console serves from static/console/vendor/ are the npm packages
its lockfile pins, byte for byte: the copy is committed (so the console runs without npm), and
a copy edited by hand or left behind by a version bump must not be served."""

import hashlib
import json
from pathlib import Path

VENDOR = Path(__file__).resolve().parents[2] / "static" / "console" / "vendor"

# idiomorph's htmx extension (the `morph` swap of live refreshes), dist/idiomorph-ext.min.js of
# the npm package at this version. A bump changes both lines here, package.json and the lockfile.
IDIOMORPH_VERSION = "0.8.0"
IDIOMORPH_EXT_SHA256 = "5811b9a7eda14878b7dab4378bf60432e1bb6f11fcfb970cc26540642650181e"


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_the_lockfile_pins_the_recorded_idiomorph():
    manifest = json.loads((VENDOR / "package.json").read_text())
    lock = json.loads((VENDOR / "package-lock.json").read_text())
    assert manifest["dependencies"]["idiomorph"] == IDIOMORPH_VERSION
    assert lock["packages"]["node_modules/idiomorph"]["version"] == IDIOMORPH_VERSION


def test_the_committed_copy_is_the_packages_file():
    assert sha256(VENDOR / "idiomorph-ext.min.js") == IDIOMORPH_EXT_SHA256
    installed = VENDOR / "node_modules" / "idiomorph" / "dist" / "idiomorph-ext.min.js"
    if installed.exists():  # after `make vendor`: the package npm installed is that file too
        assert sha256(installed) == IDIOMORPH_EXT_SHA256


def test_every_page_loads_the_morph_extension(client):
    page = client.get("/login/").content.decode()
    assert "console/vendor/idiomorph-ext.min.js" in page and 'hx-ext="morph"' in page
