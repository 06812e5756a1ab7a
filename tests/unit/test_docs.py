"""Every snippet of README.md and docs/*.md works as written.

```yaml blocks are merged into config/config.yaml (a fragment overrides the keys it names)
and must pass the workflow's own config check (`check_config`, as rules/common.smk calls
it). ```sh / ```bash / ```console blocks: blocks that only write files (the quick start's
data) are run in a scratch copy of the repo, so later blocks and configs see their files;
every other command is checked without running it: `make` targets through `make -n`,
`snakemake` arguments through Snakemake's own parser (targets must be rules or outputs
under results/), `python -m specbuild.*` and `benchmarks.*` modules must exist, and named files
must be there. ```python blocks show code as it is: their lines, in order, are lines of a file
of rules/, scripts/ or src/ (lines may be left out, none changed).
That docs/configuration.md is the schema's is config/test_schema_doc.py's.
"""

from __future__ import annotations

import copy
import importlib.util
import json
import re
import shlex
import subprocess
from pathlib import Path

import pytest
import yaml

from specbuild.config import ConfigError, check_config
from specbuild.samples import normalize_sample

REPO = Path(__file__).resolve().parents[2]
SCHEMA = REPO / "config" / "config.schema.yaml"
DEFAULT = yaml.safe_load((REPO / "config" / "config.yaml").read_text(encoding="utf-8"))
PAGES = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
# kept as written (the design card): its indented blocks are layouts, not commands
AS_WRITTEN = {"DESIGN.md"}

FENCE = re.compile(r"^```([\w-]*)[^\n]*\n(.*?)^```\s*$", re.M | re.S)
SHELL = {"sh", "bash", "console", "shell"}
KNOWN_LANGUAGES = SHELL | {"yaml", "json", "text", "python", "ini", "toml"}
# commands a block may consist of to be run in the scratch copy: they only write files there
WRITES_FILES = {"mkdir", "cat", "cp", "printf", "echo"}
# commands checked only by name: outside specbuild, or whose effect needs a cluster or server
UNCHECKED = {
    "cd",
    "cp",
    "tar",
    "git",
    "pgrep",
    "kill",
    "squeue",
    "scancel",
    "sinfo",
    "sacctmgr",
    "tensorboard",
    "nvidia-smi",
    "export",
    "tmux",
    "screen",
    "curl",
    "ls",
    "mkdir",
    "cat",
    "printf",
    "echo",
}
RULES = {
    m.group(1)
    for f in [REPO / "Snakefile", *sorted((REPO / "rules").glob("*.smk"))]
    for m in re.finditer(r"^rule (\w+):", f.read_text(encoding="utf-8"), re.M)
}
# words of how the work was done, not of the project: sessions, tracker numbers, machine holds
MEANINGLESS = re.compile(
    r"\b(sessions?|issues? #?\d+|(a|one|the|this|that|each|every|next|last)"
    r" (H200 |GPU |machine |device )?hold)\b",
    re.I,
)


def blocks(text: str) -> list[tuple[str, str, int]]:
    """(language, body, line) of each fenced block."""
    return [
        (m.group(1), m.group(2), text.count("\n", 0, m.start()) + 1) for m in FENCE.finditer(text)
    ]


def merged(fragment: dict, base: dict) -> dict:
    out = copy.deepcopy(base)
    for key, value in fragment.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = merged(value, out[key])
        else:
            out[key] = copy.deepcopy(value)
    return out


# A drafter folder a page names as an example is the reader's own: its absence is no fault of
# the page (every other check of the entry still applies).
READERS_FOLDER = re.compile(r"^bench\.drafters\.\w+: no such folder ")


def yaml_faults(body: str, workdir: Path) -> list[str]:
    try:
        fragment = yaml.safe_load(body)
    except yaml.YAMLError as err:
        return [f"not YAML: {err}"]
    if not isinstance(fragment, dict):
        return ["not a mapping of config keys"]
    try:
        check_config(merged(fragment, DEFAULT), schema=SCHEMA, source="snippet", workdir=workdir)
    except ConfigError as err:
        return [f for f in err.faults if not READERS_FOLDER.match(f)]
    return []


CODE_FILES = [
    *sorted((REPO / "rules").glob("*.smk")),
    *sorted((REPO / "scripts").glob("*.py")),
    *sorted((REPO / "src").rglob("*.py")),
]


def in_order(lines: list[str], within: list[str]) -> bool:
    rest = iter(within)
    return all(line in rest for line in lines)


def python_faults(body: str) -> list[str]:
    lines = [ln.rstrip() for ln in body.splitlines() if ln.strip()]
    for path in CODE_FILES:
        if in_order(lines, path.read_text(encoding="utf-8").splitlines()):
            return []
    return ["not code of rules/, scripts/ or src/ as it is (a line changed, or out of order)"]


def commands(body: str, language: str) -> list[str]:
    """Command lines of a shell block, continuations joined, heredocs kept with their command;
    in a console block only `$ ` lines are commands (the rest is output)."""
    lines = body.splitlines()
    if language == "console":
        lines = [ln[2:] for ln in lines if ln.startswith("$ ")]
    out: list[str] = []
    i = 0
    while i < len(lines):
        line = lines[i]
        while line.endswith("\\") and i + 1 < len(lines):
            i += 1
            line = line[:-1] + " " + lines[i].strip()
        heredoc = re.search(r"<<-?\s*'?(\w+)'?", line)
        if heredoc:
            end = lines.index(heredoc.group(1), i + 1)
            line = "\n".join(lines[i : end + 1])
            i = end
        if line.strip() and not line.lstrip().startswith("#"):
            out.append(line)
        i += 1
    return out


def simple_commands(line: str) -> list[list[str]]:
    """argv of each simple command of a line (split at && || ; |), assignments dropped."""
    first = line.split("\n", 1)[0]  # a heredoc's body is data
    lexer = shlex.shlex(first, posix=True, punctuation_chars=";&|<>")
    lexer.whitespace_split = True
    lexer.commenters = "#"
    out, argv = [], []
    for token in lexer:
        if token in {"&&", "||", ";", "|", "&"}:
            out.append(argv)
            argv = []
        else:
            argv.append(token)
    out.append(argv)
    cleaned = []
    for argv in out:
        while argv and re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*=.*", argv[0]):
            argv = argv[1:]
        # drop redirections and their targets
        words, skip = [], False
        for tok in argv:
            if skip:
                skip = False
            elif tok in {">", ">>", "<", "<<", "<<-", "2>", "&>"}:
                skip = True
            else:
                words.append(tok)
        if words:
            cleaned.append(words)
    return cleaned


def _exists(path: str, workdir: Path) -> bool:
    return "<" in path or (workdir / path).exists() or (REPO / path).exists()


def _make_faults(argv: list[str], workdir: Path) -> list[str]:
    variables = [a for a in argv[1:] if "=" in a]
    targets = [a for a in argv[1:] if "=" not in a and not a.startswith("-")]
    faults = []
    for var in variables:
        name, value = var.split("=", 1)
        if name in {"CONFIG", "SLURM_PROFILE"} and not _exists(value, workdir):
            faults.append(f"make {name}={value}: no such file")
    for target in targets or ["help"]:
        run = subprocess.run(
            ["make", "-n", "-C", str(REPO), target, *variables],
            capture_output=True,
            text=True,
        )
        if run.returncode != 0:
            faults.append(f"make {target}: {run.stderr.strip().splitlines()[-1]}")
    return faults


def _snakemake_faults(argv: list[str], workdir: Path) -> list[str]:
    from snakemake.cli import get_argument_parser

    try:
        args = get_argument_parser().parse_args(argv[1:])
    except SystemExit:
        return [f"snakemake does not take: {shlex.join(argv[1:])}"]
    faults = []
    named = [*(args.targets or []), *(args.until or []), *(args.forcerun or [])]
    named += list(args.set_resources or {})
    for name in named:
        if name not in RULES and not name.startswith(("results/", "logs/")):
            faults.append(f"snakemake: {name!r} is no rule of rules/*.smk nor an output")
    profiles = args.profile if isinstance(args.profile, list) else [args.profile]
    for path in [*(args.configfile or []), *filter(None, profiles)]:
        if not _exists(str(path), workdir):
            faults.append(f"snakemake: no such file {path}")
    return faults


def command_faults(argv: list[str], workdir: Path) -> list[str]:
    name = Path(argv[0]).name
    if argv[0].startswith(".venv/bin/"):
        argv = [name, *argv[1:]]
    if name == "make":
        return _make_faults(argv, workdir)
    if name == "snakemake":
        return _snakemake_faults(argv, workdir)
    if name in {"python", "python3"} and argv[1:2] == ["-m"]:
        module = argv[2]
        if module.startswith("snakemake"):
            return _snakemake_faults(["snakemake", *argv[3:]], workdir)
        if (
            module.startswith(("specbuild", "benchmarks"))
            and importlib.util.find_spec(module) is None
        ):
            return [f"python -m {module}: no such module"]
        return []
    if name == "bash":
        return [] if _exists(argv[1], workdir) else [f"bash {argv[1]}: no such file"]
    if name in UNCHECKED:
        return []
    return [f"{argv[0]}: not a command these docs know (tests/unit/test_docs.py UNCHECKED)"]


def page_faults(text: str, workdir: Path) -> list[str]:
    """Every fault of every snippet of a page, `line N: ...`; `workdir` is a scratch copy of
    the repo where blocks that only write files are run, in page order."""
    faults = []
    for language, body, line in blocks(text):
        where = f"line {line}"
        if language not in KNOWN_LANGUAGES:
            faults.append(f"{where}: fenced block without a known language ({language!r})")
        elif language == "yaml":
            faults += [f"{where}: {f}" for f in yaml_faults(body, workdir)]
        elif language == "python":
            faults += [f"{where}: {f}" for f in python_faults(body)]
        elif language in SHELL:
            lines = commands(body, language)
            argvs = [argv for ln in lines for argv in simple_commands(ln)]
            if argvs and all(Path(a[0]).name in WRITES_FILES for a in argvs):
                run = subprocess.run(
                    ["bash", "-euc", "\n".join(lines)], cwd=workdir, capture_output=True, text=True
                )
                if run.returncode != 0:
                    faults.append(f"{where}: failed: {run.stderr.strip()}")
                continue
            faults += [f"{where}: {f}" for argv in argvs for f in command_faults(argv, workdir)]
    return faults


def indented_code(text: str) -> list[int]:
    """Lines that start a 4-space indented code block (the test would not see it)."""
    out, in_fence, previous = [], False, ""
    for n, line in enumerate(text.splitlines(), 1):
        if line.startswith("```"):
            in_fence = not in_fence
        elif not in_fence and line.startswith("    ") and line.strip() and not previous.strip():
            out.append(n)
        previous = line
    return out


@pytest.fixture
def scratch(tmp_path: Path) -> Path:
    """The repo's files seen from a scratch folder: blocks may write beside them."""
    for entry in REPO.iterdir():
        if entry.name not in {".git", ".venv", "results", "logs", ".snakemake"}:
            (tmp_path / entry.name).symlink_to(entry)
    return tmp_path


# Pages whose snippets a test of their own runs in a built workflow folder (the files they name
# made first), deeper than a config check here can.
OWN_TEST = {
    "troubleshooting.md": "tests/workflow/test_troubleshooting_docs.py",
}


def test_pages_with_a_test_of_their_own_have_it():
    for page, test in OWN_TEST.items():
        assert (REPO / "docs" / page).is_file() and (REPO / test).is_file(), (page, test)


@pytest.mark.parametrize(
    "page",
    [p for p in PAGES if p.name not in OWN_TEST],
    ids=lambda p: p.relative_to(REPO).as_posix(),
)
def test_every_snippet_of_the_page_works(page: Path, scratch: Path):
    text = page.read_text(encoding="utf-8")
    assert page_faults(text, scratch) == []


@pytest.mark.parametrize(
    "page",
    [p for p in PAGES if p.name not in AS_WRITTEN],
    ids=lambda p: p.relative_to(REPO).as_posix(),
)
def test_every_code_block_is_fenced_so_it_is_tested(page: Path):
    assert indented_code(page.read_text(encoding="utf-8")) == []


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.relative_to(REPO).as_posix())
def test_the_docs_speak_of_the_project_only(page: Path):
    assert MEANINGLESS.findall(page.read_text(encoding="utf-8")) == []


# in code, configs and scripts too: tracker numbers, and names of the place work was done that a
# reader cannot look up ("session" stays legal there: a process session is code)
LAB_WORDS = re.compile(r"\b(issues? #?\d+|kit\b|device tool|seeds')", re.I)
TEXT_SUFFIXES = {".py", ".smk", ".yaml", ".yml", ".md", ".sh", ".rst", ".toml", ""}


def test_the_tree_speaks_of_the_project_only():
    tracked = subprocess.run(
        ["git", "ls-files"], cwd=REPO, capture_output=True, text=True, check=True
    ).stdout.split()
    hits = []
    for name in tracked:
        path = REPO / name
        skip = name.startswith("resources/") or path.name == "test_docs.py"
        if skip or path.suffix not in TEXT_SUFFIXES or not path.is_file():
            continue
        for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            hits += [f"{name}:{n}: {m.group(0)}" for m in LAB_WORDS.finditer(line)]
    assert hits == []


def test_the_readme_quick_start_has_its_config_and_its_commands():
    text = (REPO / "README.md").read_text(encoding="utf-8")
    languages = [language for language, _, _ in blocks(text)]
    assert "yaml" in languages and "make run" in text and "make test" in text


def test_the_quick_start_data_are_samples(scratch: Path):
    """The records README's quick start writes are ones `samples` keeps, every one."""
    assert page_faults((REPO / "README.md").read_text(encoding="utf-8"), scratch) == []
    lines = (scratch / "data" / "chats.jsonl").read_text(encoding="utf-8").splitlines()
    assert len(lines) >= 2
    for line in lines:
        assert normalize_sample(json.loads(line), fmt="auto")[-1]["role"] == "user"


def test_the_old_bench_drafter_snippet_fails(scratch: Path):
    old = "```yaml\nbench:\n  drafter: results/drafter/base\n```\n"
    faults = page_faults(old, scratch)
    assert len(faults) == 1 and "bench.drafter: moved to bench.variants" in faults[0]


def test_a_data_file_the_page_does_not_write_fails(scratch: Path):
    fragment = "```yaml\ndatasets:\n  mine:\n    path: data/chats.jsonl\n```\n"
    assert "no such file 'data/chats.jsonl'" in page_faults(fragment, scratch)[0]
    written = '```sh\nmkdir -p data\necho \'{"prompt": "hi"}\' > data/chats.jsonl\n```\n'
    assert page_faults(written + fragment, scratch) == []


@pytest.mark.parametrize(
    ("snippet", "fault"),
    [
        ("make runn", "make runn:"),
        ("make run CONFIG=config/nope.yaml", "no such file"),
        ("snakemake --untill tokenize", "snakemake does not take"),
        ("snakemake --configfile config/config.yaml --forcerun trian", "'trian' is no rule"),
        ("snakemake --cores 2 tokenized", "'tokenized' is no rule"),
        (".venv/bin/python -m specbuild.nope", "no such module"),
        ("bash tools/nope.sh", "no such file"),
        ("specbuild-run --all", "not a command"),
    ],
)
def test_a_wrong_command_fails(snippet: str, fault: str, scratch: Path):
    faults = page_faults(f"```sh\n{snippet}\n```\n", scratch)
    assert len(faults) == 1 and fault in faults[0]


def test_right_commands_pass(scratch: Path):
    good = [
        'make run CONFIG=config/config.yaml CORES=8 ARGS="--forcerun train"',
        "snakemake --configfile config/config.yaml --cores all --until tokenize results/serve.sh",
        ".venv/bin/python -m specbuild.config.schema_doc --check docs/configuration.md",
        "squeue -u $USER  # a comment",
    ]
    assert page_faults("```sh\n" + "\n".join(good) + "\n```\n", scratch) == []


def test_console_output_lines_are_not_commands(scratch: Path):
    console = "```console\n$ make dry-run\nBuilding DAG of jobs...\n```\n"
    assert page_faults(console, scratch) == []
    assert "without a known language" in page_faults("```\nmake run\n```\n", scratch)[0]


def test_an_indented_block_is_found():
    assert indented_code("text\n\n    make run\n\n```sh\n    make run\n```\n") == [3]


@pytest.mark.parametrize(
    ("text", "found"),
    [
        ("measured in the fourteenth session", True),
        ("(BENCHMARKS.md, issue 17.5)", True),
        ("One H200 hold: the variants", True),
        ("a shard holds one row per sample", False),
        ("helper rules sit beside the stage's rule", False),
    ],
)
def test_the_project_only_check_tells_work_notes_from_plain_words(text: str, found: bool):
    assert bool(MEANINGLESS.findall(text)) is found


def test_a_python_snippet_must_be_code_as_it_is(scratch: Path):
    rule = "```python\nrule vocab:\n    output:\n"
    rule += '        vocab="results/vocab/vocab.safetensors",\n```\n'
    assert page_faults(rule, scratch) == []
    changed = rule.replace("vocab.safetensors", "draft.safetensors")
    assert "not code of rules/" in page_faults(changed, scratch)[0]
    swapped = '```python\n        "logs/vocab/vocab.log",\nrule vocab:\n```\n'
    assert "not code of rules/" in page_faults(swapped, scratch)[0]
