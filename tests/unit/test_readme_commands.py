"""Every shell command the README and the guides show names something real, and the quick ones run.

Why: a newcomer copies the commands as written. A renamed make target, a flag a parser no longer takes
or an example file that moved left the docs wrong with nothing noticing (issue 49). devtools/readme_walk.py
finds each command (shell blocks, `$ ` lines, inline spans that start with a command word) and checks it
against the real thing: `make -q` for a target, `deepres`'s own parsers (stopped right after the parse),
a module's `main(argv)` the same way, the file for a path. The quick ones run as written, and the README's
tour runs through bash and curl against a real `deepres serve` on loopback. Fix a failure in the page, or in
KIND_RULES when a new command has no kind.
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from devtools import readme_walk
from devtools.localserver import LocalServer

ROOT = Path(__file__).resolve().parents[2]
README_TEXT = (ROOT / "README.md").read_text(encoding="utf-8")


@pytest.fixture(scope="module")
def commands() -> list[readme_walk.Command]:
    return readme_walk.walk()


def test_the_walk_finds_the_pages_commands_and_no_heredoc_body(commands: list[readme_walk.Command]) -> None:
    readme = [c.text for c in commands if c.page == "README.md" and not c.inline]
    assert readme[:2] == ["make run", "make test"], readme  # the README's "Two commands" block
    assert any(c.page == "docs/getting-started.md" and c.text == "make cluster" for c in commands)
    assert any(c.inline and c.argv[:2] == ("make", "push-images") for c in commands if c.page == "README.md")
    # the tour's heredocs: two curl commands, their JSON bodies are input, not commands
    curls = [c for c in commands if c.page == "README.md" and c.argv[:1] == ("curl",)]
    assert len(curls) == 2 and all(c.text.endswith("<< JSON") for c in curls)
    assert not [c for c in commands if c.argv and c.argv[0][:1] in "{[\"'"]


def test_every_block_command_has_a_kind(commands: list[readme_walk.Command]) -> None:
    unclassified = [f"{c.where} {c.text}" for c in commands if not c.inline and c.kind not in readme_walk.KINDS]
    assert not unclassified, f"no kind (devtools/readme_walk.py KIND_RULES): {unclassified}"


def test_every_command_names_a_real_target_subcommand_module_or_file(commands: list[readme_walk.Command]) -> None:
    found = [f"{c.where} `{c.text}`: {p}" for c in commands for p in readme_walk.problems(c)]
    assert not found, "\n".join(found)


WRONG = """\
```bash
make no-such-target
.venv/bin/deepres predict -f deploy/examples/cnn-small.yaml --no-such-flag
deepres simulate --experiment no-such-experiment
python -m devtools.gotoolchain frobnicate
python -m devtools.no_such_tool --help
bash scripts/no-such-script.sh
kubectl apply -f deploy/examples/no-such-pod.yaml
frobnicate --now
```

Then `deepres no-such-subcommand` and `deepres bench extender --no-such-option`.
"""


def test_a_wrong_target_flag_choice_module_file_or_kind_is_caught() -> None:
    commands = readme_walk.walk_text(WRONG)
    assert len(commands) == 10
    caught = {c.text: readme_walk.problems(c) for c in commands}
    missed = [text for text, problems in caught.items() if not problems]
    assert not missed, f"not caught: {missed}"

    def said(text: str, word: str) -> bool:
        return any(word in problem for problem in caught[text])

    assert said("make no-such-target", "No rule to make target 'no-such-target'")
    assert said(".venv/bin/deepres predict -f deploy/examples/cnn-small.yaml --no-such-flag", "--no-such-flag")
    assert said("deepres simulate --experiment no-such-experiment", "invalid choice: 'no-such-experiment'")
    assert said("python -m devtools.gotoolchain frobnicate", "invalid choice: 'frobnicate'")
    assert said("python -m devtools.no_such_tool --help", "no module devtools.no_such_tool")
    assert said("bash scripts/no-such-script.sh", "no file scripts/no-such-script.sh")
    assert said("kubectl apply -f deploy/examples/no-such-pod.yaml", "no file deploy/examples/no-such-pod.yaml")
    assert said("deepres no-such-subcommand", "no subcommand 'no-such-subcommand'")
    assert said("deepres bench extender --no-such-option", "deepres bench extender has no --no-such-option")
    assert caught["frobnicate --now"] == ["no kind: add a rule to devtools/readme_walk.py KIND_RULES"]


def test_right_commands_pass_and_a_pipeline_takes_its_sources_kind() -> None:
    page = ("```bash\nnice -n 19 .venv/bin/deepres predict -f deploy/examples/cnn-small.yaml --json | head -3\n"
            "python -m devtools.gotoolchain ensure 2>&1 > /dev/null && make run BIND=127.0.0.1:0\n```\n")
    commands = readme_walk.walk_text(page)
    assert [c.argv[0] for c in commands] == [".venv/bin/deepres", "head", "python", "make"]
    assert [c.kind for c in commands[:2]] == ["quick", "quick"]
    assert [readme_walk.problems(c) for c in commands] == [[], [], [], []]


def test_parsing_a_command_runs_nothing(tmp_path: Path) -> None:
    touched = tmp_path / "ran"

    def main(argv: list[str]) -> int:
        parser = argparse.ArgumentParser()
        parser.add_argument("--count", type=int, required=True)
        parser.parse_args(argv)
        touched.write_text("it ran")
        return 0

    assert readme_walk.parse_with(main, ["--count", "3"]) is None
    assert not touched.exists()
    refused = readme_walk.parse_with(main, ["--count", "three"])
    assert refused is not None and "invalid int value" in refused
    assert readme_walk.parse_with(lambda argv: 0, []) == "its main() returned without parsing its arguments"


def test_the_quick_commands_run(commands: list[readme_walk.Command]) -> None:
    """The block commands of kind `quick` (seconds, no cluster, GPU or network) run here as written, with
    this checkout's `deepres` (the one `make test` installs into .venv)."""
    quick = [c for c in commands if not c.inline and c.kind == "quick"]
    assert quick, "no quick command found: the walk or the classification broke"
    for command in quick:
        program, *args = command.argv
        assert readme_walk._is_deepres(program), f"{command.where}: a quick command this test cannot run"
        done = subprocess.run([sys.executable, "-m", "extender.cli", *args], cwd=ROOT, capture_output=True,
                              text=True, timeout=300)
        assert done.returncode == 0, f"{command.where} `{command.text}` failed:\n{done.stderr[-2000:]}"
        assert "Traceback" not in done.stderr and done.stdout.strip(), command.where
        if "--json" in args:
            assert isinstance(json.loads(done.stdout), dict), command.where


TOUR = README_TEXT[README_TEXT.index("## A three-minute tour"):README_TEXT.index("## What it has measured")]


def _answers(stdout: str) -> list[object]:
    """The JSON documents curl printed one after the other (`curl -s` adds no newline)."""
    decoder, found, at = json.JSONDecoder(), [], 0
    while at < len(stdout.rstrip()):
        value, at = decoder.raw_decode(stdout, at)
        found.append(value)
        while at < len(stdout) and stdout[at].isspace():
            at += 1
    return found


@pytest.mark.skipif(shutil.which("curl") is None, reason="the tour's commands use curl, which this machine lacks")
def test_the_readme_tour_runs_as_written_against_a_real_server(tmp_path: Path) -> None:
    """The tour's shell block, as written, through bash and curl against `deepres serve --no-kube` on
    loopback (its port and token file in place of 127.0.0.1:8888 and .venv-serve/run-token, which
    `make run` would give): the answers are the ones the README shows."""
    block = re.search(r"```bash\n(.*?)```", TOUR, re.S)
    assert block is not None, "the tour has no shell block"
    with LocalServer(tmp_path, token="tour-token") as server:
        def run(script: str) -> list[object]:
            script = script.replace("127.0.0.1:8888", f"127.0.0.1:{server.port}")
            script = script.replace(".venv-serve/run-token", str(tmp_path / f"token-{server.port}"))
            done = subprocess.run(["bash", "-c", script], cwd=tmp_path, capture_output=True, text=True, timeout=60)
            assert done.returncode == 0, done.stderr
            return _answers(done.stdout)

        ready = re.search(r"`(curl -s 127\.0\.0\.1:8888/readyz)` answers `\{\"ready\":true,\.\.\.\}`", TOUR)
        assert ready is not None, "the tour no longer shows the readiness check"
        (readiness,) = run(ready.group(1))
        assert isinstance(readiness, dict) and readiness["ready"] is True

        said_telemetry = re.search(r"# answers (\{.*?\})\n", block.group(1))
        shown_filter = re.search(r"```json\n(.*?)\n```", TOUR, re.S)
        assert said_telemetry is not None and shown_filter is not None
        assert run(block.group(1)) == [json.loads(said_telemetry.group(1)), json.loads(shown_filter.group(1))]

        gpu_c = re.search(r'`"NodeNames": \["gpu-c"\]` alone .*? `(\{.*?\})` in `FailedAndUnresolvableNodes`', TOUR,
                          re.S)
        assert gpu_c is not None, "the tour no longer shows the node without telemetry"
        filter_only = block.group(1)[block.group(1).rindex("curl -s"):]
        (answer,) = run(filter_only.replace('"NodeNames": ["gpu-a", "gpu-c"]', '"NodeNames": ["gpu-c"]'))
        assert isinstance(answer, dict) and answer["NodeNames"] == []
        assert answer["FailedAndUnresolvableNodes"] == json.loads(gpu_c.group(1))
