"""etcd's checks of a TLS client's certificate beyond the CA's signature.

* ``--client-crl-file``: a client whose certificate's serial number the revocation list names
  is cut off once the handshake is done, as etcd's TLS listener cuts it off. As there, the
  list's own signature is not checked, and a list changed on disk counts from the next
  connection (etcd reads the file for every connection; here it is read again when its size
  or modification time changed). Python's ssl module shows the server the client's leaf
  certificate only, so the leaf is checked (etcd checks every certificate the client sent;
  with clients whose certificates the CA signs directly, the same).
* ``--client-cert-allowed-hostname``: the certificate must name that host among its DNS (or IP)
  subject alternative names, wildcards as Go's VerifyHostname matches them; a client without
  a certificate is refused too, as etcd's check refuses it.
"""
from __future__ import annotations

import ipaddress
import logging
import os
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # imported where a certificate is read: ~50 ms of every start that checks none
    from cryptography import x509

logger = logging.getLogger(__name__)


class CertificateCheck:
    """Called with the client's certificate (DER, or None) once a TLS handshake is done; returns
    why the connection is refused, or None."""

    def __init__(self, crl_file: Path | None = None, allowed_hostname: str | None = None) -> None:
        self.crl_file = crl_file
        self.allowed_hostname = allowed_hostname
        self._crl_stamp: tuple[int, int] | None = None
        self._revoked: frozenset[int] = frozenset()
        if crl_file is not None:
            self.revoked()  # an unreadable list stops the start, not the first client

    def revoked(self) -> frozenset[int]:
        """The serial numbers the list names, read again if the file changed."""
        st = os.stat(self.crl_file)
        stamp = (st.st_mtime_ns, st.st_size)
        if stamp != self._crl_stamp:
            from cryptography import x509

            data = Path(self.crl_file).read_bytes()
            crl = (x509.load_pem_x509_crl(data) if data.lstrip().startswith(b"-----")
                   else x509.load_der_x509_crl(data))
            self._revoked = frozenset(r.serial_number for r in crl)
            self._crl_stamp = stamp
        return self._revoked

    def __call__(self, der: bytes | None) -> str | None:
        from cryptography import x509

        cert = x509.load_der_x509_certificate(der) if der else None
        if self.crl_file is not None and cert is not None:
            try:
                revoked = self.revoked()
            except (OSError, ValueError) as exc:  # etcd refuses the connection when it cannot read the list
                return f"cannot read the revocation list {self.crl_file}: {exc}"
            if cert.serial_number in revoked:
                n = cert.serial_number
                return f"certificate serial {n.to_bytes((n.bit_length() + 7) // 8, 'big').hex()} revoked"
        if self.allowed_hostname is not None:
            if cert is None or not names_host(cert, self.allowed_hostname):
                return "client certificate authentication failed"
        return None


def rejects(check: CertificateCheck, transport) -> bool:
    """Run ``check`` on a TLS connection whose handshake is done; a refused client is logged
    (etcd's "rejected connection") and its connection closed before anything is read from it."""
    der = transport.get_extra_info("ssl_object").getpeercert(binary_form=True)
    try:
        why = check(der)
    except Exception as exc:  # noqa: BLE001 - an unparsable certificate is refused, not a crash
        why = f"cannot check the client certificate: {exc}"
    if why is None:
        return False
    logger.warning("rejected connection remote_addr=%s error=%s", (transport.get_extra_info("peername") or ("?",))[0],
                   why)
    transport.close()
    return True


def names_host(cert: x509.Certificate, host: str) -> bool:
    """Go's x509 VerifyHostname: an IP against the IP SANs, a name against the DNS SANs (case
    aside, a trailing dot aside, ``*.`` standing for one whole leftmost label)."""
    from cryptography import x509

    try:
        sans = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except x509.ExtensionNotFound:
        return False
    candidate = host.strip("[]")
    try:
        ip = ipaddress.ip_address(candidate)
    except ValueError:
        ip = None
    if ip is not None:
        return ip in sans.get_values_for_type(x509.IPAddress)
    want = host.lower().rstrip(".").split(".")
    for pattern in sans.get_values_for_type(x509.DNSName):
        labels = pattern.lower().rstrip(".").split(".")
        if len(labels) != len(want):
            continue
        if all(p == w or (i == 0 and p == "*" and w) for i, (p, w) in enumerate(zip(labels, want))):
            return True
    return False
