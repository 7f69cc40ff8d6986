"""The server's TLS context, reloaded in place when the certificate files change.

A Kubernetes Secret volume swaps its files on rotation. Loading the new pair
into the live SSLContext makes every new connection use it, while
connections already open keep theirs: no restart, no failed request. A pair
that does not load (say the key is written before the certificate) is left
for the next check and the old pair stays in force.
"""

from __future__ import annotations

import logging
import os
import ssl
from dataclasses import dataclass, field
from pathlib import Path

from webhook import certs
from webhook.errors import CertificateError

log = logging.getLogger(__name__)


def _stamp(paths: list[Path]) -> tuple[tuple[int, int, int], ...]:
    stamps = []
    for path in paths:
        st = os.stat(path)
        stamps.append((st.st_ino, st.st_size, st.st_mtime_ns))
    return tuple(stamps)


@dataclass
class ReloadingTLS:
    cert: Path
    key: Path
    client_ca: Path | None = None
    context: ssl.SSLContext = field(init=False)
    not_after: float = field(init=False, default=0.0)
    client_ca_not_after: float = field(init=False, default=0.0)
    _stamp: tuple[tuple[int, int, int], ...] = field(init=False, default=())

    def __post_init__(self) -> None:
        self.context = self._new_context()
        self._stamp = self._current_stamp()
        self._load_into(self.context)

    def _paths(self) -> list[Path]:
        return [self.cert, self.key] + ([self.client_ca] if self.client_ca else [])

    def _current_stamp(self) -> tuple[tuple[int, int, int], ...]:
        try:
            return _stamp(self._paths())
        except OSError as exc:
            raise CertificateError(f"cannot read certificate files: {exc}") from exc

    def _new_context(self) -> ssl.SSLContext:
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.minimum_version = ssl.TLSVersion.TLSv1_2
        if self.client_ca is not None:
            ctx.verify_mode = ssl.CERT_REQUIRED
        return ctx

    def _load_into(self, ctx: ssl.SSLContext) -> None:
        try:
            ctx.load_cert_chain(self.cert, self.key)
            if self.client_ca is not None:
                ctx.load_verify_locations(cafile=str(self.client_ca))
            self.not_after = certs.not_after(self.cert.read_bytes()).timestamp()
            if self.client_ca is not None:
                self.client_ca_not_after = certs.not_after(self.client_ca.read_bytes()).timestamp()
        except (OSError, ssl.SSLError, ValueError) as exc:
            raise CertificateError(f"cannot load {self.cert} / {self.key}: {exc}") from exc

    def reload_if_changed(self) -> bool:
        """Load the files again if they changed; True when a new pair is in force."""
        try:
            stamp = _stamp(self._paths())
        except OSError as exc:
            log.warning("certificate files not readable, keeping the loaded pair: %s", exc)
            return False
        if stamp == self._stamp:
            return False
        self._load_into(self._new_context())  # raises, leaving the live context alone
        self._load_into(self.context)
        self._stamp = stamp
        log.info("serving certificate reloaded from %s", self.cert)
        return True
