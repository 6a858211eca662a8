"""What users install: the wheel and the sdist.

Both are built from this checkout by the backend pyproject.toml names (hatchling, from
this venv: no index is asked), once per module, and read as pip and PyPI read them: the
wheel's files and metadata, the sdist's files, and the wheel's files alone running a suite
from a directory outside the checkout.
"""

from __future__ import annotations

import configparser
import re
import shutil
import subprocess
import sys
import tarfile
import zipfile
from dataclasses import dataclass
from pathlib import Path

import pytest
from packaging.metadata import Metadata
from packaging.requirements import Requirement

try:
    import tomllib
except ImportError:  # Python 3.10: pytest depends on tomli there
    import tomli as tomllib

ROOT = Path(__file__).resolve().parent.parent
SRC = ROOT / "src" / "pytest_mailbox"
PROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]
HANG_NET = 120  # seconds: only for a build or a run that never ends
#: What the sdist holds at its top: pyproject.toml's [tool.hatch.build.targets.sdist]
#: include, .gitignore (hatchling always adds it) and PKG-INFO.
SDIST_TOP = {
    ".ci",
    ".gitignore",
    "CHANGELOG.md",
    "LICENSE",
    "Makefile",
    "PKG-INFO",
    "README.md",
    "benchmarks",
    "conftest.py",
    "docs",
    "examples",
    "mkdocs.yml",
    "pyproject.toml",
    "src",
    "tests",
}
#: Names a checkout holds that no distribution may.
JUNK = re.compile(
    r"(^|/)(__pycache__|\.venv[^/]*|\.node|node_modules|\.pytest_cache|\.mypy_cache|"
    r"\.ruff_cache|\.hypothesis|\.coverage[^/]*|htmlcov|\.demo|build|dist|[^/]*\.egg-info|"
    r"[^/]*\.pyc)(/|$)"
)


@dataclass(frozen=True)
class Dists:
    wheel: Path
    sdist: Path


def build(project: Path, out: Path, *targets: str) -> list[Path]:
    """The distributions hatchling builds from ``project`` into ``out`` (default: both)."""
    command = [sys.executable, "-m", "hatchling", "build", "-d", str(out)]
    for target in targets:
        command += ["-t", target]
    subprocess.run(command, cwd=project, check=True, capture_output=True, timeout=HANG_NET)
    return sorted(out.iterdir())


@pytest.fixture(scope="module")
def dists(tmp_path_factory: pytest.TempPathFactory) -> Dists:
    out = tmp_path_factory.mktemp("dist")
    built = build(ROOT, out)
    (wheel,) = (path for path in built if path.suffix == ".whl")
    (sdist,) = (path for path in built if path.name.endswith(".tar.gz"))
    return Dists(wheel, sdist)


def wheel_files(wheel: Path) -> dict[str, bytes]:
    with zipfile.ZipFile(wheel) as archive:
        return {name: archive.read(name) for name in archive.namelist()}


def sdist_files(sdist: Path) -> list[str]:
    """The sdist's files, without its top folder (``pytest_mailbox-<version>/``)."""
    with tarfile.open(sdist) as archive:
        names = [member.name for member in archive.getmembers() if member.isfile()]
    return [name.split("/", 1)[1] for name in names]


def metadata(wheel: Path) -> Metadata:
    """The wheel's METADATA, checked as PyPI checks it: a field that its
    Metadata-Version does not have, or a value out of form, raises."""
    dist_info = f"pytest_mailbox-{PROJECT['version']}.dist-info"
    return Metadata.from_email(wheel_files(wheel)[f"{dist_info}/METADATA"], validate=True)


def test_the_wheel_holds_the_package_its_license_and_nothing_else(dists: Dists) -> None:
    modules = {f"pytest_mailbox/{path.name}" for path in SRC.glob("*.py")}
    dist_info = f"pytest_mailbox-{PROJECT['version']}.dist-info"
    assert set(wheel_files(dists.wheel)) == {
        *modules,
        "pytest_mailbox/py.typed",  # mypy reads the installed package's hints
        f"{dist_info}/METADATA",
        f"{dist_info}/WHEEL",
        f"{dist_info}/RECORD",
        f"{dist_info}/entry_points.txt",
        f"{dist_info}/licenses/LICENSE",
    }


def test_the_wheel_registers_the_plugin_with_pytest(dists: Dists) -> None:
    dist_info = f"pytest_mailbox-{PROJECT['version']}.dist-info"
    entry_points = configparser.ConfigParser()
    entry_points.read_string(wheel_files(dists.wheel)[f"{dist_info}/entry_points.txt"].decode())
    # A module that names the plugin, so that naming the plugin itself beside it loads it once.
    assert dict(entry_points["pytest11"]) == {"mailbox": "pytest_mailbox._entry_point"}
    entry_point = wheel_files(dists.wheel)["pytest_mailbox/_entry_point.py"].decode()
    assert 'pytest_plugins = ["pytest_mailbox.plugin"]' in entry_point.splitlines()


def test_the_wheels_metadata_is_what_pypi_accepts_and_pyproject_says(dists: Dists) -> None:
    """hatchling below 1.27 wrote License-Expression and License-File under
    Metadata-Version 2.1, which has neither: twine check and PyPI refuse such a wheel."""
    meta = metadata(dists.wheel)
    assert meta.metadata_version in {"2.4", "2.5"}
    assert (meta.name, str(meta.version)) == ("pytest-mailbox", PROJECT["version"])
    assert str(meta.requires_python) == PROJECT["requires-python"]
    assert meta.license_expression == "MIT"
    assert meta.license_files == ["LICENSE"]
    required = {str(req) for req in meta.requires_dist or [] if req.marker is None}
    assert required == {str(Requirement(req)) for req in PROJECT["dependencies"]}
    assert {"xdist", "mcp"} <= set(meta.provides_extra or [])
    assert {"Framework :: Pytest", "Typing :: Typed"} <= set(meta.classifiers or [])
    assert meta.description_content_type == "text/markdown"
    assert meta.description == (ROOT / "README.md").read_text(encoding="utf-8")


#: A link's target in Markdown (inline or reference) or in HTML.
LINK = re.compile(
    r"\]\(\s*<?([^)\s>]+)|^\s*\[[^\]]+\]:\s*<?(\S+?)>?\s*$|\b(?:href|src)=[\"']([^\"']+)",
    re.MULTILINE,
)


def test_every_link_of_the_readme_works_on_pypi() -> None:
    """The README is the project's page on PyPI, which resolves a relative link against
    its own address (pypi.org/project/pytest-mailbox/docs/…): every one is a 404 there."""
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    targets = [next(group for group in found if group) for found in LINK.findall(readme)]
    assert [target for target in targets if not target.startswith("https://")] == []


def test_the_sdist_holds_the_sources_tests_and_docs_and_no_junk(dists: Dists) -> None:
    files = sdist_files(dists.sdist)
    assert {name.split("/", 1)[0] for name in files} == SDIST_TOP
    package = {name for name in wheel_files(dists.wheel) if name.startswith("pytest_mailbox/")}
    assert {f"src/{name}" for name in package} <= set(files)
    assert {"tests/conftest.py", "docs/index.md", "docs/examples/test_quickstart.py"} <= set(files)
    assert [name for name in files if JUNK.search(name)] == []


def test_the_sdist_leaves_out_what_a_run_left_at_the_top_of_the_checkout(
    tmp_path: Path,
) -> None:
    """A report or a receipts file written at the top of a checkout is in no .gitignore:
    while the sdist took every file git does not ignore, it shipped them."""
    project = tmp_path / "project"
    shutil.copytree(
        SRC, project / "src" / "pytest_mailbox", ignore=shutil.ignore_patterns("__pycache__")
    )
    for name in ("pyproject.toml", "README.md", "LICENSE"):
        shutil.copy(ROOT / name, project / name)
    for stray in ("junit.xml", "receipts.jsonl", "report.html", "notes/todo.txt"):
        (project / stray).parent.mkdir(exist_ok=True)
        (project / stray).write_text("left by a run\n")
    (sdist,) = build(project, tmp_path / "out", "sdist")
    assert {name.split("/", 1)[0] for name in sdist_files(sdist)} == {
        "src",
        "pyproject.toml",
        "README.md",
        "LICENSE",
        "PKG-INFO",
    }


def test_a_wheel_built_from_the_sdist_is_the_wheel(dists: Dists, tmp_path: Path) -> None:
    """What pip builds when it installs from the sdist (no wheel for the platform, or
    ``--no-binary``) is what the wheel holds, byte for byte."""
    with tarfile.open(dists.sdist) as archive:
        top = archive.getnames()[0].split("/", 1)[0]
        archive.extractall(tmp_path, filter="data")
    (rebuilt,) = build(tmp_path / top, tmp_path / "out", "wheel")
    assert rebuilt.name == dists.wheel.name
    assert wheel_files(rebuilt) == wheel_files(dists.wheel)


#: The venv's plugins but xdist, which a user's need not have, left out of the inner runs:
#: they start in half the time (hypothesis' plugin imports hypothesis, a second here).
OTHER_PLUGINS = (
    *("asyncio", "randomly", "pytest-retry", "hypothesispytest", "django", "anyio"),
    *("html", "html_fixtures", "metadata", "pytest_jsonreport", "pytest_reportlog"),
    *("socket", "time_machine", "freezer", "platformdirs"),
)
WHERE = """
from pathlib import Path


def test_the_plugin_is_the_wheels(request):
    for name in ("mailbox", "pytest_mailbox.plugin"):
        plugin = request.config.pluginmanager.get_plugin(name)
        assert Path(plugin.__file__).is_relative_to({site!r}), plugin.__file__
"""


@pytest.mark.parametrize("workers", ["0", "2"])
def test_the_wheels_files_alone_run_the_quickstart_outside_the_checkout(
    pytester: pytest.Pytester,
    monkeypatch: pytest.MonkeyPatch,
    dists: Dists,
    tmp_path: Path,
    workers: str,
) -> None:
    """The wheel's files, first on the path, serve the first test of the docs from a
    folder of their own, and the receipts command reads the report it left: nothing the
    plugin needs is left in the checkout (the tests import it from ``src``)."""
    site = tmp_path / "site-packages"  # the name coverage maps back to src (pyproject.toml)
    with zipfile.ZipFile(dists.wheel) as archive:
        archive.extractall(site)
    monkeypatch.setenv("PYTHONPATH", str(site))
    pytester.makepyfile(
        test_quickstart=(ROOT / "docs" / "examples" / "test_quickstart.py").read_text(),
        test_where=WHERE.format(site=str(site)),
    )
    blocked = [arg for name in OTHER_PLUGINS for arg in ("-p", f"no:{name}")]
    result = pytester.runpytest_subprocess(
        *blocked,
        *("-W", "error", "-p", "no:cacheprovider", "-n", workers, "--junitxml=junit.xml"),
        timeout=HANG_NET,
    )
    result.assert_outcomes(passed=2)
    receipts = pytester.run(
        sys.executable, "-m", "pytest_mailbox", "receipts", "junit.xml", timeout=HANG_NET
    )
    assert receipts.ret == 0, receipts.stderr.str()
    receipts.stdout.fnmatch_lines(["test_quickstart.py::test_signup *released_success*"])


def test_the_readmes_quick_start_is_make_demo_and_make_test() -> None:
    """The README's quick start is two commands on a fresh machine, and comes first:
    a README rewritten for PyPI had moved them under a later heading."""
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    headings = re.findall(r"^## (.+)$", readme, flags=re.MULTILINE)
    assert headings[0] == "Quick start"
    section = readme.split("## Quick start\n", 1)[1].split("\n## ", 1)[0]
    commands = re.findall(r"^```console\n(.*?)^```", section, flags=re.MULTILINE | re.DOTALL)
    assert [block.splitlines() for block in commands] == [["make demo", "make test"]]
