"""Test certificates made with `cryptography`: a CA, server and client certs."""
from __future__ import annotations

import datetime
import ipaddress
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID


def _name(cn: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)])


def _key():
    return ec.generate_private_key(ec.SECP256R1())


def _pem_key(key) -> bytes:
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())


def _cert(subject: str, key, issuer_name: x509.Name, issuer_key, *, ca: bool, usage=None, sans=(), valid_for=None):
    now = datetime.datetime.now(datetime.timezone.utc)
    b = (
        x509.CertificateBuilder()
        .subject_name(_name(subject))
        .issuer_name(issuer_name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + (valid_for or datetime.timedelta(days=1)))
        .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True)
        # what real CAs put in (and Python 3.13's default client context, X509_STRICT, requires)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(issuer_key.public_key()), critical=False)
        .add_extension(x509.KeyUsage(digital_signature=not ca, content_commitment=False, key_encipherment=False,
                                     data_encipherment=False, key_agreement=False, key_cert_sign=ca, crl_sign=ca,
                                     encipher_only=False, decipher_only=False), critical=True)
    )
    if usage:
        b = b.add_extension(x509.ExtendedKeyUsage(usage), critical=False)
    if sans:
        b = b.add_extension(x509.SubjectAlternativeName(list(sans)), critical=False)
    return b.sign(issuer_key, hashes.SHA256())


def make_pki(directory: Path, name: str = "ca", client_cns: tuple[str, ...] = (),
             client_dns: tuple[str, ...] = ()) -> dict[str, Path]:
    """Files: ca.pem (and its key, ca-key), server.pem/server-key.pem (127.0.0.1, localhost),
    client.pem/client-key.pem, for each CN in `client_cns` a client certificate with that Common
    Name ("client:CN", "client:CN-key"), and for each name in `client_dns` one whose subject
    alternative name is that DNS name ("client-dns:NAME", "client-dns:NAME-key")."""
    directory.mkdir(parents=True, exist_ok=True)
    ca_key = _key()
    ca = _cert(f"{name} test CA", ca_key, _name(f"{name} test CA"), ca_key, ca=True)
    files = {"ca": directory / f"{name}.pem", "ca-key": directory / f"{name}-key.pem"}
    files["ca"].write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    files["ca-key"].write_bytes(_pem_key(ca_key))
    issued = [(f"client-dns:{dns}", f"client-dns-{dns}", f"client {dns}", ExtendedKeyUsageOID.CLIENT_AUTH,
               [x509.DNSName(dns)]) for dns in client_dns]
    issued += [("server", "server", f"{name}-server", ExtendedKeyUsageOID.SERVER_AUTH, _SERVER_SANS),
               ("client", "client", f"{name}-client", ExtendedKeyUsageOID.CLIENT_AUTH, [])]
    issued += [(f"client:{cn}", f"client-cn-{cn}", cn, ExtendedKeyUsageOID.CLIENT_AUTH, []) for cn in client_cns]
    for label, file, subject, usage, sans in issued:
        files[label], files[f"{label}-key"] = directory / f"{name}-{file}.pem", directory / f"{name}-{file}-key.pem"
        _issue(ca, ca_key, subject, usage, sans, files[label], files[f"{label}-key"])
    return files


_SERVER_SANS = [x509.IPAddress(ipaddress.ip_address("127.0.0.1")), x509.DNSName("localhost")]


def _issue(ca: x509.Certificate, ca_key, subject: str, usage, sans, cert_path: Path, key_path: Path,
           valid_for: datetime.timedelta | None = None) -> x509.Certificate:
    """A certificate for a new key, signed by ``ca``, written (PEM) with its key."""
    key = _key()
    cert = _cert(subject, key, ca.subject, ca_key, ca=False, usage=[usage], sans=sans, valid_for=valid_for)
    key_path.write_bytes(_pem_key(key))
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    return cert

def write_crl(path: Path, pki: dict[str, Path], revoked: tuple[Path, ...]) -> Path:
    """A CRL (PEM) signed by the PKI's CA, revoking the certificates in the files ``revoked``."""
    ca = x509.load_pem_x509_certificate(pki["ca"].read_bytes())
    ca_key = serialization.load_pem_private_key(pki["ca-key"].read_bytes(), password=None)
    now = datetime.datetime.now(datetime.timezone.utc)
    b = x509.CertificateRevocationListBuilder().issuer_name(ca.subject).last_update(now).next_update(
        now + datetime.timedelta(days=1)).add_extension(
        x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), critical=False).add_extension(
        x509.CRLNumber(1), critical=False)
    for f in revoked:
        serial = x509.load_pem_x509_certificate(f.read_bytes()).serial_number
        b = b.add_revoked_certificate(x509.RevokedCertificateBuilder().serial_number(serial).revocation_date(now).build())
    path.write_bytes(b.sign(ca_key, hashes.SHA256()).public_bytes(serialization.Encoding.PEM))
    return path


def server_cert(pki: dict[str, Path], cert_path: Path, key_path: Path) -> int:
    """Write a new server certificate (127.0.0.1, localhost) and key signed by the PKI's CA to
    ``cert_path`` and ``key_path`` (a renewal); its serial number."""
    return _renewed(pki, cert_path, key_path, "renewed server", ExtendedKeyUsageOID.SERVER_AUTH,
                    _SERVER_SANS).serial_number


def client_cert(pki: dict[str, Path], cert_path: Path, key_path: Path,
                valid_for: datetime.timedelta | None = None) -> x509.Certificate:
    """Write a new client certificate and key signed by the PKI's CA to ``cert_path`` and
    ``key_path``, valid for ``valid_for`` from now (default: a day); the certificate."""
    return _renewed(pki, cert_path, key_path, "renewed client", ExtendedKeyUsageOID.CLIENT_AUTH, [], valid_for)


def _renewed(pki, cert_path: Path, key_path: Path, what: str, usage, sans, valid_for=None) -> x509.Certificate:
    """``_issue`` by the CA of the PKI's files."""
    ca = x509.load_pem_x509_certificate(pki["ca"].read_bytes())
    ca_key = serialization.load_pem_private_key(pki["ca-key"].read_bytes(), password=None)
    return _issue(ca, ca_key, f"{ca.subject.rfc4514_string()} {what}", usage, sans, cert_path, key_path, valid_for)


def member_tls_flags(pki: dict[str, Path]) -> tuple[str, ...]:
    """A shardetcd's flags to serve clients over TLS with the PKI's server certificate, clients
    required to present one of its CA (--client-cert-auth), and its own calls to a writer made
    with the PKI's client certificate."""
    return ("--cert-file", str(pki["server"]), "--key-file", str(pki["server-key"]), "--trusted-ca-file",
            str(pki["ca"]), "--client-cert-auth", "--client-cert-file", str(pki["client"]),
            "--client-key-file", str(pki["client-key"]))


def nats_server_tls_flags(pki: dict[str, Path]) -> tuple[str, ...]:
    """nats-server's flags to require TLS with a client certificate of the PKI's CA."""
    return ("--tlsverify", "--tlscert", str(pki["server"]), "--tlskey", str(pki["server-key"]),
            "--tlscacert", str(pki["ca"]))


def journal_tls_flags(pki: dict[str, Path]) -> tuple[str, ...]:
    """A shardetcd's flags to reach such NATS servers: their CA and the PKI's client certificate."""
    return ("--journal-trusted-ca-file", str(pki["ca"]), "--journal-cert-file", str(pki["client"]),
            "--journal-key-file", str(pki["client-key"]))


def journal_tls_access(pki: dict[str, Path], creds_file: Path | None = None):
    """What ``journal_tls_flags`` (and ``--journal-creds-file creds_file``) give a shardetcd, for
    this process: a journal.jetstream.NatsAccess."""
    from journal.jetstream import NatsAccess

    return NatsAccess(str(pki["ca"]), str(pki["client"]), str(pki["client-key"]),
                      None if creds_file is None else str(creds_file))
