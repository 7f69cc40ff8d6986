"""Exit codes: 0 nothing denied, 1 denials (or warnings with --fail-on warn), 2 usage, 3 unexpected,
141 the output's reader gone."""

from __future__ import annotations

import io
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from tests.audit.support import CLUSTER, GPU_POD, SHARED_POD, TOO_NEW_POD, audit, audit_process, write
from tests.support import POLICIES, REPO, assert_crashed, break_the_engine, invalid_policies
from webhook import cli


def test_0_when_nothing_is_denied(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = audit(capsys, "--cluster-state", str(CLUSTER), str(write(tmp_path / "p.yaml", GPU_POD + "---\n" + SHARED_POD)))
    assert (code, err) == (0, "")


def test_1_when_one_object_is_denied(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, _, _ = audit(capsys, "--cluster-state", str(CLUSTER), str(write(tmp_path / "p.yaml", GPU_POD + "---\n" + TOO_NEW_POD)))
    assert code == 1


def test_fail_on_warn_counts_warnings(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = str(write(tmp_path / "p.yaml", SHARED_POD))
    assert audit(capsys, "--cluster-state", str(CLUSTER), path)[0] == 0
    assert audit(capsys, "--cluster-state", str(CLUSTER), "--fail-on", "warn", path)[0] == 1


@pytest.mark.parametrize("args, message", [
    ([], "error: nothing to audit: give manifest PATHs, - for stdin, or --cluster"),
    (["no/such/file.yaml"], "error: no/such/file.yaml: no such file or folder"),
    (["--cluster-state", "no/such/dir", "-"], "error: cluster state no/such/dir: no such file or folder"),
    (["--cluster", "--cluster-state", "x", "-"], "error: --cluster and --cluster-state are alternatives: use one"),
])  # fmt: skip
def test_2_on_usage_errors_in_one_line(capsys: pytest.CaptureFixture[str], args: list[str], message: str) -> None:
    code, out, err = audit(capsys, *args)
    assert (code, out, err) == (2, "", message + "\n")


def test_2_on_an_unknown_format_from_argparse() -> None:
    done = audit_process("-o", "yaml", "-")
    assert done.returncode == 2 and "invalid choice: 'yaml'" in done.stderr


def test_2_on_an_invalid_policy_with_file_and_field(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    policies = invalid_policies(tmp_path / "policies")
    code, out, err = audit(capsys, str(write(tmp_path / "p.yaml", GPU_POD)), policies=policies)
    assert code == 2 and out == "" and err.startswith("invalid policy:") and "gpu-defaults.yaml" in err and "mode" in err


def test_3_on_an_unexpected_error_in_one_line_and_the_traceback_with_debug(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    break_the_engine(monkeypatch)
    path = str(write(tmp_path / "p.yaml", GPU_POD))
    assert_crashed(lambda *args: audit(capsys, *args, path))


@pytest.mark.parametrize("output", ["text", "junit"])
def test_141_and_nothing_said_when_the_reader_of_the_output_goes_away(tmp_path: Path, output: str) -> None:
    # `gpu-admission audit ... | head -1`: head reads one line and exits; the audit's next writes fail
    # (junit: a report of manifests is made whole, then written in pieces: one write of it all gave 0)
    path = str(write(tmp_path / "p.yaml", "---\n".join([GPU_POD] * 2000)))
    audit = subprocess.Popen([sys.executable, "-m", "webhook", "audit", "--policies", str(POLICIES), "-o", output, path],
                             cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert audit.stdout is not None and audit.stderr is not None
    assert (b"Pod ml-a/trainer" if output == "text" else b"<?xml") in audit.stdout.readline()
    audit.stdout.close()
    assert audit.wait(120) == 141
    assert audit.stderr.read() == b""


def test_a_broken_pipe_is_the_reader_gone_only_when_the_output_is_a_pipe_without_a_reader() -> None:
    """141 and silence only for an output whose reader went away; a BrokenPipeError from anywhere else
    (a pipe the command itself wrote to) is an unexpected error, said and exit 3."""
    read_end, write_end = os.pipe()
    with open(write_end, "w") as output, open(read_end, "rb") as reader:
        assert not cli.output_closed(output)  # read still
        output.write("a line\n")
        output.flush()
        assert reader.readline() == b"a line\n"
        assert not cli.output_closed(output)
        reader.close()
        assert cli.output_closed(output)  # its reader went away
    with tempfile.TemporaryFile("w") as file:
        assert not cli.output_closed(file)
    assert not cli.output_closed(io.StringIO())  # no descriptor


def test_3_when_a_pipe_other_than_the_output_breaks(tmp_path: Path) -> None:
    # the audit's output read to the end, but a pipe of its own broke: not the reader gone
    script = ("import sys\nfrom webhook import cli\ndef broken(args):\n    raise BrokenPipeError(32, 'Broken pipe')\n"
              "cli._certs_generate = broken\n"
              "sys.exit(cli.main(['certs', 'generate', '--out', sys.argv[1]]))\n")
    done = subprocess.run([sys.executable, "-c", script, str(tmp_path)], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert done.returncode == 3, done
    assert "unexpected error" in done.stderr and "BrokenPipeError" in done.stderr
