"""The shell commands the README and the guides show, walked: each is found, classified, and checked
against what it names.

A command is a line of a fenced block marked as shell (```bash, ```sh, ```shell, ```console; a
heredoc's body is the command's input, not commands), a `$ ` line of any fenced block, or an inline code
span that starts with a command word (`make`, `deepres`, `python -m`, ...). Each simple command (split
at `&&`, `||`, `|`, `;` and `&`, its redirections, env assignments and `nice`/`timeout` wrappers left
out) is checked against the real thing it names:

- `make TARGET`: a target of the Makefile (`make -q`, which runs nothing, answers 2 for no such rule);
- `deepres ...` (or `.venv/bin/deepres`, `.venv-serve/bin/deepres`): `extender.cli.main` parses it with
  the real parsers, stopped right after the parse (nothing runs);
- `python -m MODULE ...`: the module's `main(argv)` parses it the same way;
- `bash FILE`, and every argument that is a path into the repository (`deploy/examples/cnn-small.yaml`,
  `./helm/deepres`): the file exists.

Inline spans are often fragments (`deepres profile TARGET`): for them only the target, the subcommand,
the module and the flags are checked, not a full parse. Each block command gets a KIND (KIND_RULES, the
first match): `quick` ones run here in seconds and tests/unit/test_readme_commands.py runs them for real.

    python -m devtools.readme_walk            # every command, its kind and its problems; exit 1 on a problem
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import importlib.util
import inspect
import io
import re
import shlex
import subprocess
import sys
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any
from unittest import mock

ROOT = Path(__file__).resolve().parents[1]
PAGES = (ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")), ROOT / "data" / "README.md")
SHELL_BLOCKS = {"bash", "sh", "shell", "console"}
#: what a kind means (every block command has one; `quick` ones are run by the test)
KINDS = {
    "quick": "runs here in seconds: no cluster, GPU, root or network; writes nothing in the repository",
    "serves": "starts a server that runs until stopped (the tour's tests drive it over HTTP)",
    "asks-server": "asks a running local extender or agent (curl to 127.0.0.1)",
    "cluster": "needs a Kubernetes cluster (kubectl, helm install, make cluster)",
    "gpu": "needs an NVIDIA GPU",
    "root": "needs root and apt-get or buildah",
    "network": "downloads or pushes (PyPI, npm, a registry, the Go module proxy, GitHub)",
    "long": "minutes or more on two cores",
    "writes": "rewrites files of the repository (generated pages, reports)",
    "user-file": "reads a file of the user's own (pod.yaml): parsed here, not run",
    "train-extra": "traces a training step on the CPU with torch (the train extra): seconds to a minute each",
    "shell": "shell bookkeeping (a variable, export, echo, cd, a checksum)",
}
#: (regex on the command as written, kind): the first match wins; a block command matching none is a problem
KIND_RULES: tuple[tuple[str, str], ...] = (
    (r"^(export|cd|echo|mkdir|sha256sum|[A-Za-z_][A-Za-z0-9_]*=)", "shell"),
    (r"--device cuda|--source nvml|--gpu-campaign", "gpu"),
    (r"^make (run|e2e)?$|^make run\b|deepres (serve|agent)\b", "serves"),
    (r"^curl\b.*(127\.0\.0\.1|localhost)", "asks-server"),
    (r"^(kubectl|helm install|helm upgrade|helm uninstall)\b|^make (cluster|cluster-down|e2e)\b|devtools\.realnode",
     "cluster"),
    (r"^make (images|node-deps)\b|^buildah\b", "root"),
    (r"^make (tools|push-images|venv|serve-venv)\b|pip (install|download)|-m venv\b|^curl\b|gotoolchain (ensure|pin)",
     "network"),
    (r"^make (test|unit|lint|typecheck|imports|docs|cluster-bins)\b", "long"),
    (r"deepres (dataset|train|evaluate|bench)\b|deepres simulate\b(?!.*--quick)|devtools\.trial\b|^python3? -m pip\b",
     "long"),
    (r"deepres report\b", "writes"),
    (r"deepres predict\b.* -f (?!deploy/)", "user-file"),
    (r"deepres profile\b", "train-extra"),
    (r"deepres (predict|simulate)\b|^make predict\b", "quick"),
)
_COMMAND_WORDS = re.compile(r"^(make|deepres|\.venv(-serve)?/bin/\w+|python3? -m|bash|nice)\s")
_REPO_PATH = re.compile(r"^(\./)?(deploy|helm|docs|scripts|data|reports|tests|devtools|extender|predictor|cluster)/")
_PLACEHOLDER = re.compile(r"<[A-Za-z][^<>]*>")
_SUBST = re.compile(r"\$\([^()]*\)")
_HEREDOC = re.compile(r"<<-?\s*['\"]?(\w+)['\"]?")
_SEPARATORS = {"&&", "||", "|", ";", "&", ";;"}
_WRAPPERS = {"nice": 0, "timeout": 1, "sudo": 0, "env": 0, "exec": 0}  # the words each takes before the command


@dataclass(frozen=True)
class Command:
    page: str  # README.md, docs/admin.md
    line: int  # where it starts in the page
    text: str  # the simple command as written (continuation lines joined, wrappers and assignments kept)
    argv: tuple[str, ...]  # its words, less env assignments, wrappers and redirections
    inline: bool  # from an inline code span (a fragment: checked, never run)
    kind: str = ""

    @property
    def where(self) -> str:
        return f"{self.page}:{self.line}"


# ----------------------------------------------------------------------------------------------
# finding the commands


def _fenced(text: str) -> Iterator[tuple[int, str, list[str]]]:
    """(first line number of the body, info string, body lines) of every fenced block."""
    lines = text.splitlines()
    i = 0
    while i < len(lines):
        opened = re.match(r"^(\s*)(```+|~~~+)\s*([\w+-]*)", lines[i])
        if not opened:
            i += 1
            continue
        fence, info, start = opened.group(2), opened.group(3), i + 1
        end = start
        while end < len(lines) and not lines[end].lstrip().startswith(fence):
            end += 1
        yield start + 1, info, lines[start:end]
        i = end + 1


def _logical_lines(body: list[str], first: int) -> Iterator[tuple[int, str]]:
    """(line number, text) of each logical line of a shell block: continuations joined, heredoc bodies
    and comment-only lines skipped."""
    i = 0
    while i < len(body):
        number, line = first + i, body[i]
        while line.rstrip().endswith("\\") and i + 1 < len(body):
            i += 1
            line = line.rstrip()[:-1] + " " + body[i].strip()
        i += 1
        heredoc = _HEREDOC.search(line)
        if heredoc:
            while i < len(body) and body[i].strip() != heredoc.group(1):
                i += 1
            i += 1
        if line.strip() and not line.lstrip().startswith("#"):
            yield number, line.strip()


def _words(line: str) -> list[str]:
    """Shell words and operators of one line (comments dropped; `$(...)` and `<placeholder>` as one word)."""
    line = _SUBST.sub("SUBST", _PLACEHOLDER.sub("PLACEHOLDER", line))
    lexer = shlex.shlex(line, posix=True, punctuation_chars=True)
    lexer.whitespace_split = True
    return list(lexer)


def _simple_commands(words: list[str]) -> Iterator[tuple[list[str], bool]]:
    """(words, whether it reads the previous command's output through a pipe) of each simple command."""
    current: list[str] = []
    piped = False
    for word in words:
        if word in _SEPARATORS:
            if current:
                yield current, piped
            current, piped = [], word == "|"
        else:
            current.append(word)
    if current:
        yield current, piped


def _argv(words: list[str]) -> list[str]:
    """The command's own words: redirections (and their targets), leading assignments and wrappers left out."""
    out: list[str] = []
    skip = False
    for i, word in enumerate(words):
        if skip:
            skip = False
            continue
        if set(word) <= set("<>&") and word:
            if out and out[-1].isdigit() and i > 0 and words[i - 1] == out[-1]:
                out.pop()  # 2>&1: the descriptor
            skip = True
            continue
        out.append(word)
    while out and re.match(r"^[A-Za-z_][A-Za-z0-9_]*=", out[0]):
        out.pop(0)
    while out and out[0] in _WRAPPERS:
        taken = 2 if out[0] == "nice" and out[1:2] == ["-n"] else _WRAPPERS[out[0]]  # `nice -n 19`, `timeout 500`
        out = out[1 + taken:]
    return out


def _commands_of(page: str, number: int, line: str, inline: bool) -> Iterator[Command]:
    try:
        words = _words(line)
    except ValueError:  # an unbalanced quote: not a shell line
        return
    kind = ""
    for simple, piped in _simple_commands(words):
        command = Command(page, number, " ".join(simple), tuple(_argv(simple)), inline)
        kind = kind if piped else classify(command)  # `curl ... | grep x`: the pipeline's kind is its source's
        yield replace(command, kind=kind)


def walk_text(text: str, page: str = "page.md") -> list[Command]:
    """Every command of one page's text."""
    found: list[Command] = []
    for first, info, body in _fenced(text):
        if info in SHELL_BLOCKS:
            for number, line in _logical_lines(body, first):
                found += _commands_of(page, number, line.removeprefix("$ "), inline=False)
        else:
            for offset, line in enumerate(body):
                if line.startswith("$ "):
                    found += _commands_of(page, first + offset, line[2:], inline=False)
    outside = re.sub(r"^(```|~~~).*?^\1", lambda m: "\n" * m.group(0).count("\n"), text, flags=re.M | re.S)
    for number, line in enumerate(outside.splitlines(), 1):
        for span in re.findall(r"`([^`\n]+)`", line):
            if _COMMAND_WORDS.match(span + " "):
                found += _commands_of(page, number, span, inline=True)
    return found


def walk(pages: Sequence[Path] = PAGES) -> list[Command]:
    """Every command of the README, the guides and data/README.md (docs/cli.md is generated from the
    parsers: left out)."""
    found: list[Command] = []
    for path in pages:
        if path.name == "cli.md":
            continue
        found += walk_text(path.read_text(encoding="utf-8"), str(path.relative_to(ROOT)))
    return found


def classify(command: Command) -> str:
    """The kind of a command (KIND_RULES, on its text with `.venv/bin/` and wrappers left out); "" when none."""
    text = " ".join(command.argv)
    text = re.sub(r"(^|\s)\.venv(-serve)?/bin/", r"\1", text)
    if not command.argv:  # only assignments
        text = command.text
    for pattern, kind in KIND_RULES:
        if re.search(pattern, text):
            return kind
    return ""


# ----------------------------------------------------------------------------------------------
# checking what a command names


class _Parsed(Exception):
    """Raised right after a successful parse: the command is not run."""


@contextlib.contextmanager
def _parse_only() -> Iterator[None]:
    original = argparse.ArgumentParser.parse_args

    def parse_then_stop(self: argparse.ArgumentParser, args: Any = None, namespace: Any = None) -> Any:
        original(self, args, namespace)
        raise _Parsed

    with mock.patch.object(argparse.ArgumentParser, "parse_args", parse_then_stop):
        yield


def parse_with(main: Any, argv: Sequence[str]) -> str | None:
    """None when `main(argv)` parses argv with its real parser (nothing runs); else argparse's complaint."""
    err = io.StringIO()
    try:
        with _parse_only(), contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
            main(list(argv))
    except _Parsed:
        return None
    except SystemExit as exit_:
        if exit_.code in (0, None):  # --help, --version
            return None
        return err.getvalue().strip().splitlines()[-1] if err.getvalue().strip() else f"exit {exit_.code}"
    return "its main() returned without parsing its arguments"


def _is_deepres(program: str) -> bool:
    return program in ("deepres", ".venv/bin/deepres", ".venv-serve/bin/deepres")


def _module_main(name: str) -> tuple[Any, str | None]:
    if importlib.util.find_spec(name) is None:
        return None, f"no module {name}"
    module = importlib.import_module(name)
    main = getattr(module, "main", None)
    if main is None or "parse_args(" not in inspect.getsource(main):
        return None, f"{name} has no main(argv) that parses its arguments first: cannot check it without running it"
    return main, None


def _make_target_problem(targets: Sequence[str]) -> str | None:
    done = subprocess.run(["make", "-q", "-C", str(ROOT), *targets], capture_output=True, text=True, timeout=60,
                          check=False)
    if done.returncode == 2:
        return (done.stderr.strip().splitlines() or ["make failed"])[-1]
    return None


def _fragment_problems(argv: Sequence[str]) -> list[str]:
    """What an inline `deepres ...` fragment names that does not exist: its subcommand or a flag."""
    from devtools import docsgen
    from extender.cli import COMMANDS

    words = list(argv[1:])
    sub = next((w for w in words if not w.startswith("-")), None)
    if sub is None or sub.isupper():  # `deepres SUBCOMMAND`: a placeholder
        return []
    if sub not in COMMANDS:
        return [f"no subcommand {sub!r}"]
    parsers = docsgen.command_parsers()
    line = f"deepres {sub}"
    after = words[words.index(sub) + 1:]
    if after and not after[0].startswith("-") and f"{line} {after[0]}" in parsers:
        line = f"{line} {after[0]}"
    known = docsgen.flags_of(parsers["deepres"]) | docsgen.flags_of(parsers[line]) | \
        docsgen.flags_of(parsers[f"deepres {sub}"])
    flags = [w.split("=")[0] for w in words if w.startswith("-") and w not in ("-", "--")]
    return [f"{line} has no {flag}" for flag in flags if flag not in known]


def problems(command: Command) -> list[str]:
    """What the command names that does not exist, or arguments its parser refuses ([] when it checks out)."""
    argv = command.argv
    out: list[str] = []
    if not command.inline and not command.kind:
        out.append("no kind: add a rule to devtools/readme_walk.py KIND_RULES")
    if not argv:
        return out
    program, args = argv[0], list(argv[1:])
    if program == "make":
        targets = [a for a in args if "=" not in a and not a.startswith("-")]
        problem = _make_target_problem(targets)
        if problem:
            out.append(problem)
    elif _is_deepres(program):
        if command.inline:
            out += _fragment_problems(argv)
        else:
            from extender.cli import main

            problem = parse_with(main, args)
            if problem:
                out.append(f"deepres refuses it: {problem}")
    elif re.fullmatch(r"(\.venv(-serve)?/bin/)?python3?", program) and args[:1] == ["-m"] and len(args) > 1:
        name = args[1]
        if name not in ("venv", "pip"):
            main, problem = _module_main(name)
            if problem and (not command.inline or problem.startswith("no module")):
                out.append(problem)
            elif main is not None and not command.inline:
                problem = parse_with(main, args[2:])
                if problem:
                    out.append(f"python -m {name} refuses it: {problem}")
    elif program in ("bash", "sh") and args and not args[0].startswith("-") and not (ROOT / args[0]).is_file():
        out.append(f"no file {args[0]}")
    for arg in args:
        value = re.sub(r"\.py:\w+$", ".py", arg.split("=", 1)[-1])  # `profile FILE.py:build`: the file
        if _REPO_PATH.match(value) and "PLACEHOLDER" not in value and not any(ROOT.glob(value.removeprefix("./"))):
            out.append(f"no file {value}")
    return out


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m devtools.readme_walk", description=__doc__.splitlines()[0])
    parser.add_argument("--kind", choices=sorted(KINDS), help="only the block commands of this kind")
    args = parser.parse_args(argv)
    bad = 0
    for command in walk():
        if args.kind and (command.inline or command.kind != args.kind):
            continue
        found = problems(command)
        bad += bool(found)
        kind = "inline" if command.inline else command.kind or "?"
        print(f"{command.where}\t{kind}\t{command.text}" + "".join(f"\n    PROBLEM: {p}" for p in found))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
