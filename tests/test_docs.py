"""The README and the documentation site (docs/, mkdocs.yml) as a user meets them: the code
blocks marked to run do run, the API reference names every public name, every page is in the
navigation, and every figure, raw result and code comment's link to docs/performance.md lands.

A block runs when the line before it is ``<!-- test: run -->`` (python: in a fresh process;
bash: each line), or ``<!-- test: run under mpiexec -n N [as FILE] -->`` (python, written to
FILE and run on N ranks). docs/writing-an-algorithm.md has its own test (test_tutorial.py).
``mkdocs build --strict`` itself runs as a layer of tests/run_all.py."""
import ast
import glob
import os
import pathlib
import re
import subprocess
import sys
import tempfile

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DOCS = os.path.join(ROOT, "docs")
MARK = re.compile(r"<!-- test: run(?: under mpiexec -n (?P<n>\d+))?(?: as (?P<file>[\w.-]+))? -->\n"
                  r"```(?P<lang>\w+)\n(?P<body>.*?)```", re.S)
PAGES = sorted(glob.glob(os.path.join(DOCS, "*.md")) + glob.glob(os.path.join(DOCS, "*", "*.md")))


def read(path):
    with open(path) as f:
        return f.read()


def runnable_blocks():
    out = []
    for path in [os.path.join(ROOT, "README.md")] + PAGES:
        if path.endswith("writing-an-algorithm.md"):
            continue
        for i, m in enumerate(MARK.finditer(read(path))):
            out.append(pytest.param(m.group("lang"), m.group("body"), m.group("n"), m.group("file"),
                                    id=f"{os.path.relpath(path, ROOT)}#{i + 1}"))
    return out


def test_readme_and_the_concept_pages_have_blocks_that_run():
    ids = [p.id for p in runnable_blocks()]
    for page in ("README.md", "docs/getting-started.md", "docs/concepts.md"):
        assert any(i.startswith(page + "#") for i in ids), page


@pytest.mark.timeout(600)
@pytest.mark.parametrize("lang,body,ranks,name", runnable_blocks())
def test_marked_code_block_runs(lang, body, ranks, name):
    with tempfile.TemporaryDirectory(prefix="docs-block-") as here:  # nothing left behind
        run_block(lang, body, ranks, name, pathlib.Path(here))


def run_block(lang, body, ranks, name, tmp_path):
    bindir = os.path.dirname(sys.executable)
    env = dict(os.environ, PYTHONPATH=ROOT, PATH=bindir + os.pathsep + os.environ.get("PATH", ""),
               COLLECTIVES_AUTOTUNE_FILE=str(tmp_path / "autotune.json"),
               COLLECTIVES_TUNING=str(tmp_path / "no-tuning.json"), TF_CPP_MIN_LOG_LEVEL="2")
    for var in ("COLLECTIVES_ALGO", "COLLECTIVES_PLUGINS", "COLLECTIVES_TRANSPORT"):
        env.pop(var, None)
    if lang == "bash":
        commands = [line for line in body.splitlines() if line.strip() and not line.startswith("#")]
    else:
        assert lang == "python", lang
        script = tmp_path / (name or "block.py")
        script.write_text(body)
        command = [sys.executable, str(script)]
        if ranks:
            mpiexec = os.path.join(bindir, "mpiexec")
            if not os.path.exists(mpiexec):
                pytest.skip("needs the virtual environment's mpiexec")
            command = [mpiexec, "-n", ranks] + command
        commands = [command]
    for command in commands:
        proc = subprocess.run(command if isinstance(command, list) else ["bash", "-c", command], cwd=tmp_path,
                              env=env, capture_output=True, text=True, timeout=540)
        assert proc.returncode == 0, f"{command}: exit {proc.returncode}\n{(proc.stdout + proc.stderr)[-3000:]}"
    assert not (tmp_path / "autotune.json").exists() or ranks  # only MPI runs calibrate and store


def public_names(package):
    """``__all__`` of a package, read from its source (tf_bridge needs TensorFlow to import)."""
    tree = ast.parse(read(os.path.join(ROOT, package, "__init__.py")))
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "__all__" for t in node.targets):
            return ast.literal_eval(node.value)
    raise AssertionError(f"{package} has no __all__")


# names the package loads on first use, documented at the module that defines them
LAZY = {"MPIComm": "collectives.comm.mpi.MPIComm", "simulate": "collectives.simulator.simulate"}


@pytest.mark.parametrize("package", ["collectives", "tf_bridge"])
def test_the_api_reference_renders_every_public_name(package):
    page = read(os.path.join(DOCS, "api", f"{package}.md"))
    documented = set(re.findall(r"^::: ([\w.]+)$", page, re.M))
    missing = [name for name in public_names(package)
               if f"{package}.{name}" not in documented and LAZY.get(name) not in documented]
    assert not missing, f"docs/api/{package}.md lacks {missing}"


def nav_pages():
    return set(re.findall(r":\s*([\w/.-]+\.md)\s*$", read(os.path.join(ROOT, "mkdocs.yml")), re.M))


def test_every_page_is_in_the_navigation_and_the_issue_pages_are_there():
    pages = {os.path.relpath(p, DOCS) for p in PAGES}
    assert pages <= nav_pages(), pages - nav_pages()
    for page in ("getting-started.md", "concepts.md", "api/collectives.md", "api/tf_bridge.md", "clusters.md",
                 "tensorflow.md", "training.md", "reliability.md", "environment.md", "writing-an-algorithm.md",
                 "architecture.md", "performance.md", "gpu.md"):
        assert page in pages, page


def test_readme_is_a_users_guide():
    text = read(os.path.join(ROOT, "README.md"))
    assert len(text.splitlines()) <= 200
    quick = re.search(r"^## Quick start\n+```bash\n(.*?)```", text, re.M | re.S).group(1).splitlines()
    assert len(quick) == 2 and quick[1].endswith("tests/run_all.py") and "'.[mpich,test,tf]'" in quick[1]
    assert "benchmarks.allreduce_perf" in quick[0] and "'.[mpich]'" in quick[0]
    assert text.count("![") == 1 and "docs/performance.md" in text


def test_performance_page_cites_what_is_kept_and_only_that():
    text = read(os.path.join(DOCS, "performance.md"))
    for image in re.findall(r"\]\((img/[\w.-]+\.png)\)", text):
        assert os.path.getsize(os.path.join(DOCS, image)) > 10000, image
    cited = set(re.findall(r"(20\d\d-\d\d-\d\d-[\w-]+)/", text))
    kept = {os.path.basename(d) for d in glob.glob(os.path.join(ROOT, "benchmarks", "results", "*")) if os.path.isdir(d)}
    assert cited == kept, (cited ^ kept)
    for folder in kept:
        assert os.path.exists(os.path.join(ROOT, "benchmarks", "results", folder, "README.md")), folder
    for folder, name in re.findall(r"(20\d\d-\d\d-\d\d-[\w-]+)/([\w.-]+\.(?:txt|json))", text):
        assert os.path.exists(os.path.join(ROOT, "benchmarks", "results", folder, name)), (folder, name)
    for section in ("sweep-against-native", "transports-and-shared-arrays", "open-mpi-and-intel-mpi", "emulated-cluster",
                    "tensorflow-step-times", "simulator-against-measurement"):
        assert "{#" + section + "}" in text, section


def test_code_comments_link_to_sections_that_exist():
    anchors = set(re.findall(r"\{#([\w-]+)\}", read(os.path.join(DOCS, "performance.md"))))
    links = []
    for path in glob.glob(os.path.join(ROOT, "**", "*.py"), recursive=True):
        if "/.venv/" in path or "/site/" in path:
            continue
        links += [(os.path.relpath(path, ROOT), a) for a in re.findall(r"docs/performance\.md#([\w-]+)", read(path))]
    assert links, "no code comment links to docs/performance.md"
    broken = [(path, anchor) for path, anchor in links if anchor not in anchors]
    assert not broken, broken
