"""The command line: serve | certs | policies | audit. Each returns an exit code.

Exit codes: 0 clean, 1 violations found (or an expected error, one line),
2 usage or invalid policy, 3 unexpected error, 130 interrupted.
"""

from __future__ import annotations

import argparse
import logging
import os
import select
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import IO, Final

from webhook import __version__
from webhook.cluster.config import ClusterConfigError
from webhook.errors import GpuAdmissionError, PolicyError
from webhook.ledger import settings as ledger_settings
from webhook.logs import FORMATS
from webhook.registry import flags
from webhook.server.loop import CHOICES as EVENT_LOOPS

EXIT_OK, EXIT_FOUND, EXIT_USAGE, EXIT_UNEXPECTED, EXIT_INTERRUPTED = 0, 1, 2, 3, 130
#: the reader of the output went away (``| head``): what a shell reports for a process SIGPIPE ended
EXIT_READER_GONE = 141

log = logging.getLogger("webhook")


def main(argv: Sequence[str] | None = None) -> int:
    words = sys.argv[1:] if argv is None else list(argv)
    parser = _parser(_command(words))
    args = parser.parse_args(words)
    logging.basicConfig(level=getattr(args, "log_level", "INFO"), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        return int(args.func(args))
    except PolicyError as exc:
        print(f"invalid policy:\n{exc}", file=sys.stderr)
        return EXIT_USAGE
    except (GpuAdmissionError, ClusterConfigError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_FOUND
    except KeyboardInterrupt:
        return EXIT_INTERRUPTED
    except BrokenPipeError:
        if output_closed(sys.stdout):
            return _reader_gone()
        log.exception("unexpected error")  # a pipe of another kind broke: a failure like any other
        return EXIT_UNEXPECTED
    except Exception:
        log.exception("unexpected error")
        return EXIT_UNEXPECTED


def output_closed(stream: IO[str]) -> bool:
    """Whether the reader of ``stream`` (a pipe or a socket) went away: its descriptor polls as
    failed (a write end of a pipe without a reader, a socket its peer shut). False for a stream
    without a descriptor, and for a terminal, a file or a pipe still read."""
    try:
        fd = stream.fileno()
    except (OSError, ValueError, AttributeError):
        return False
    poller = select.poll()
    poller.register(fd, select.POLLOUT)  # (POLLERR and POLLHUP come whatever is asked)
    return any(events & (select.POLLERR | select.POLLHUP) for _, events in poller.poll(0))


def _reader_gone() -> int:
    """The output's reader closed it (``gpu-admission audit … | head``): no error to print, and the
    rest of the output, which the interpreter flushes on its way out, goes nowhere instead of failing
    again."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError):  # a stdout without a descriptor (main called in-process)
        pass
    finally:
        os.close(devnull)
    return EXIT_READER_GONE


def _command(words: Sequence[str]) -> str | None:
    """The command ``words`` name (their first word that is no global option, nor its value)."""
    rest = iter(words)
    for word in rest:
        if word == "--log-level":
            next(rest, None)
        elif not word.startswith("-"):
            return word
    return None


#: what a command's parser imports besides the server's modules: "compiler", the CEL compiler of
#: ``policies compile``; "audit", the audit commands (audit, test, report) and the cluster's modules.
#: A command not named here (an audit command, or none: ``--help``) has everything.
_IMPORTS: Final = {"serve": frozenset[str](), "certs": frozenset[str](), "policies": frozenset({"compiler"})}
_EVERYTHING: Final = frozenset({"compiler", "audit"})


def _parser(command: str | None = None) -> argparse.ArgumentParser:
    """The CLI's parser for ``command`` (None: every command's, as ``--help`` lists them). What a
    command does not parse is not imported: the audit commands (audit, test, report) import the
    cluster's modules (the kubernetes client, ~20 MB resident), which serve, certs and policies do
    without, and ``policies compile`` imports the CEL compiler (webhook/cel, ~1.4 MB resident), which
    serve and certs do without: a server without a cluster imports neither."""
    parser = argparse.ArgumentParser(prog="gpu-admission", description=__doc__.splitlines()[0])
    parser.add_argument("--version", action="version", version=f"gpu-admission {__version__}")
    parser.add_argument("--log-level", default="INFO", choices=["DEBUG", "INFO", "WARNING", "ERROR"])
    sub = parser.add_subparsers(dest="command", required=True)
    _serve_parser(sub)
    _certs_parser(sub)
    needs = _IMPORTS.get(command or "", _EVERYTHING)
    _policies_parser(sub, compiler="compiler" in needs)
    if "audit" not in needs:
        return parser
    from webhook import audit
    from webhook.audit import report_command, suite

    audit.add_parser(sub)
    suite.add_parser(sub)
    report_command.add_parser(sub)
    return parser


def _seconds(text: str) -> float:
    """A duration in seconds, 0 or more (argparse answers a usage error, exit 2, otherwise)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds") from None
    if not value >= 0 or value == float("inf"):  # (NaN fails the first test)
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds of 0 or more")
    return value


def _positive_seconds(text: str) -> float:
    value = _seconds(text)
    if value == 0:
        raise argparse.ArgumentTypeError(f"{text!r}: must be more than 0 seconds")
    return value


def _serve_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("serve", help="run the TLS admission server")
    p.add_argument("--policies", type=Path, default=Path("policies"))
    p.add_argument("--compiled", type=Path, metavar="DIR",
                   help="the output of `policies compile` installed in the cluster: skip the rule parts it runs")
    p.add_argument("--tls-cert", type=Path, help="default certs/tls.crt (generated when absent)")
    p.add_argument("--tls-key", type=Path, help="default certs/tls.key")
    p.add_argument("--client-ca", type=Path, help="require client certificates signed by this CA")
    p.add_argument("--client-name", action="append", default=[], metavar="NAME",
                   help="with --client-ca: accept only a client certificate whose subject CN or a DNS/IP/URI SAN "
                        "is NAME (repeatable); any other is closed after the handshake")
    p.add_argument("--metrics-port", type=int, metavar="PORT",
                   help="serve /metrics (and /healthz, /readyz) in plain HTTP on this port, and no longer /metrics "
                        "on the TLS port; keep it internal (deploy/networkpolicy)")
    p.add_argument("--host", default="0.0.0.0")
    p.add_argument("--port", type=int, default=8443)
    p.add_argument("--reload-interval", type=_positive_seconds, default=2.0, help="seconds between file checks")
    p.add_argument("--shutdown-timeout", type=_positive_seconds, default=15.0, help="seconds from SIGTERM to exit, drain included")
    p.add_argument("--drain", type=_seconds, default=5.0, help="seconds to keep serving after SIGTERM, /readyz 503")
    p.add_argument("--header-timeout", type=_positive_seconds, default=5.0, help="seconds to receive a request's headers")
    p.add_argument("--park-after", type=_seconds, default=1.0,
                   help="seconds a request's headers may trickle in before the connection is not read again "
                        "until the header timeout (0: never)")
    p.add_argument("--body-timeout", type=_positive_seconds, default=10.0, help="seconds to receive a request's body")
    p.add_argument("--handshake-timeout", type=_positive_seconds, default=5.0, help="seconds for a client's TLS handshake")
    p.add_argument("--idle-timeout", type=_positive_seconds, default=120.0,
                   help="seconds before an idle connection is closed (longer than kube-apiserver keeps one idle: 90 s)")
    p.add_argument("--max-connections", type=int, default=1000, help="client connections open at once")
    p.add_argument("--eval-deadline", type=_positive_seconds, default=2.0, help="seconds a large object's evaluation may take")
    p.add_argument("--log-mutations", action="store_true",
                   help="log each admission that only patches at INFO (default: DEBUG; denials and audit findings are INFO)")
    p.add_argument("--log-format", choices=FORMATS, default="auto",
                   help="auto: text lines on a terminal, JSON lines otherwise (as in a pod)")
    p.add_argument("--event-loop", choices=EVENT_LOOPS, default="auto",
                   help="auto: uvloop where installed (3-12%% less CPU per request, docs/performance.md), else asyncio")
    p.add_argument("--kubeconfig", help="use this kubeconfig (default: in-cluster, then KUBECONFIG)")
    p.add_argument("--context", help="kubeconfig context")
    p.add_argument("--no-cluster", action="store_true", help="run with an empty cluster view")
    flags.add_arguments(p, "admission waits at most --registry-budget-ms, then resolves in the background")
    p.add_argument("--registry-budget-ms", type=int, default=300, help="what admission waits for unknown images")
    ledger_settings.add_arguments(p, _positive_seconds)
    p.set_defaults(func=_serve)



def _serve(args: argparse.Namespace) -> int:
    from webhook import logs
    from webhook.server import run

    output = logs.configure(args.log_level, args.log_format)
    try:
        return run.serve(args, output)
    finally:  # what the server logged comes before what the command prints on its way out
        output.flush()


def _certs_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("certs", help="make certificates")
    csub = p.add_subparsers(dest="certs_command", required=True)
    gen = csub.add_parser("generate", help="a development CA and serving certificate")
    gen.add_argument("--out", type=Path, required=True)
    gen.add_argument("--service", default="gpu-admission")
    gen.add_argument("--namespace", default="gpu-admission")
    gen.add_argument("--dns", action="append", default=[], help="extra DNS name (repeatable)")
    gen.add_argument("--ip", action="append", default=[], help="extra IP address (repeatable)")
    gen.add_argument("--days", type=int, default=365)
    gen.set_defaults(func=_certs_generate)
    for name, help_text in (
        ("install", "create or renew the CA and serving Secrets and set the webhooks' caBundle (idempotent)"),
        ("rotate", "issue a new serving certificate now (and a new CA with --rotate-ca or when due)"),
    ):
        cmd = csub.add_parser(name, help=help_text)
        cmd.add_argument("--namespace", default="gpu-admission")
        cmd.add_argument("--service", default="gpu-admission")
        cmd.add_argument("--webhook-config", default="gpu-admission", help="name of both webhook configurations")
        cmd.add_argument("--days", type=int, default=365, help="serving certificate lifetime")
        cmd.add_argument("--renew-before-days", type=int, default=30)
        cmd.add_argument("--dns", action="append", default=[],
                         help="extra DNS name in the serving certificate (repeatable; for clientConfig.url)")
        cmd.add_argument("--ip", action="append", default=[],
                         help="extra IP address in the serving certificate (repeatable; for clientConfig.url)")
        cmd.add_argument("--kubeconfig")
        cmd.add_argument("--context")
        if name == "rotate":
            cmd.add_argument("--rotate-ca", action="store_true", help="also a new CA (the old one stays trusted)")
        cmd.set_defaults(func=_certs_cluster)


def _certs_generate(args: argparse.Namespace) -> int:
    from webhook import certs  # (here: cryptography is ~9 MB resident, which serve does without)

    names = [*certs.service_names(args.service, args.namespace), *args.dns]
    ca, cert, key = certs.generate_files(args.out, names, args.ip, days=args.days)
    print(f"CA certificate: {ca}\nserving certificate: {cert}\nserving key: {key}")
    return EXIT_OK


def _certs_cluster(args: argparse.Namespace) -> int:
    from webhook.cluster import bootstrap, load_api_client

    api = load_api_client(args.kubeconfig, args.context)
    if api is None:
        raise ClusterConfigError("no cluster: set KUBECONFIG, pass --kubeconfig, or run in a pod")
    settings = bootstrap.Settings(
        namespace=args.namespace, service=args.service, webhook_config=args.webhook_config,
        serving_days=args.days, renew_before_days=args.renew_before_days,
        extra_dns=tuple(args.dns), extra_ips=tuple(args.ip),
    )
    try:
        if args.certs_command == "rotate":
            report = bootstrap.rotate(api, settings, rotate_ca=args.rotate_ca)
        else:
            report = bootstrap.install(api, settings)
    finally:
        api.close()
    print(report)
    return EXIT_OK


def _policies_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser], compiler: bool = True) -> None:
    p = sub.add_parser("policies", help="work with policy files")
    psub = p.add_subparsers(dest="policies_command", required=True)
    check = psub.add_parser("check", help="validate a policy directory; exit 2 on any problem")
    check.add_argument("directory", type=Path)
    check.set_defaults(func=_policies_check)
    if not compiler:
        return
    from webhook.cel import command as compile_command

    compile_command.add_parser(psub)


def _policies_check(args: argparse.Namespace) -> int:
    from webhook.policy import loader

    try:
        policy_set = loader.load_enforcing(args.directory)  # as the server loads it
    except PolicyError as exc:
        for problem in exc.problems:
            print(problem)
        print(f"{len(exc.problems)} problem(s) in {args.directory}", file=sys.stderr)
        return EXIT_USAGE
    count = len(policy_set.exceptions)
    exceptions = f", {count} exception{'s' if count > 1 else ''}" if count else ""
    print(
        f"{args.directory}: {len(policy_set.policies)} policies, {len(policy_set.classes)} workload classes, "
        f"{len(policy_set.kinds)} workload kinds{exceptions}: OK"
    )
    for exception in policy_set.exceptions:  # what each lifts, and where: an exception is reviewed like a policy
        print(f"  exception {exception.metadata.name}: {exception.summary()}")
    for skipped in loader.skipped_files(args.directory):
        print(f"  not read (only .yaml and .yml files are): {skipped.relative_to(args.directory)}")
    return EXIT_OK


if __name__ == "__main__":
    sys.exit(main())
