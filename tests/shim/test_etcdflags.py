"""etcd's command line read as etcd reads it (shim/etcdflags.py): Go's flag syntax and value
parsers, ETCD_* variables, the configuration file, and which flags are applied, refused or
without effect. tests/integration/test_etcd_command_line.py compares with etcd itself."""
from __future__ import annotations

import pytest

from shim.cli import build_parser, config_from_args
from shards.durations import go_duration_s as go_duration
from shim.etcdflags import FLAGS, FlagError, go_bool, go_int, go_urls, normalize, refusal

PARSER = build_parser()


def read(argv, env=None):
    return normalize(list(argv), PARSER, env or {})


def config(argv, env=None):
    return config_from_args(PARSER.parse_args(read(argv, env).argv))


def refused(argv, env=None) -> FlagError:
    with pytest.raises(FlagError) as info:
        read(argv, env)
    return info.value


@pytest.mark.parametrize("text, value", [("1", True), ("t", True), ("T", True), ("TRUE", True), ("true", True),
                                         ("True", True), ("0", False), ("f", False), ("FALSE", False),
                                         ("False", False)])
def test_go_bools(text, value):
    assert go_bool(text) is value


@pytest.mark.parametrize("text", ["yes", "on", "tRUE", "", " true"])
def test_go_refuses_other_bools(text):
    with pytest.raises(ValueError):
        go_bool(text)


@pytest.mark.parametrize("text, kind, value", [
    ("10000", "uint64", 10000), ("0x10", "uint", 16), ("0X1f", "uint", 31), ("017", "uint", 15), ("0o17", "uint", 15),
    ("0b101", "uint", 5), ("1_000", "int", 1000), ("1__0", "int", None), ("_1", "int", None), ("1_", "int", None), ("0x_1F", "int", 31), ("0_7", "int", 7), ("-5", "int64", -5),
    ("+5", "int64", 5), ("-5", "uint", None), ("+5", "uint", None), ("08", "int", None), ("", "int", None),
    ("0x", "int", None), (" 5", "int", None), ("5 ", "int", None), ("1e3", "int", None), ("0", "uint", 0),
    ("18446744073709551615", "uint64", 2**64 - 1), ("18446744073709551616", "uint64", None),
    ("9223372036854775807", "int64", 2**63 - 1), ("-9223372036854775809", "int64", None),
])
def test_go_integers(text, kind, value):
    if value is None:
        with pytest.raises(ValueError):
            go_int(text, kind)
    else:
        assert go_int(text, kind) == value


@pytest.mark.parametrize("text, seconds", [
    ("0", 0.0), ("5s", 5.0), ("100ms", 0.1), ("1h30m", 5400.0), ("1.5s", 1.5), ("1.s", 1.0), (".5s", 0.5),
    ("300us", 300e-6), ("300µs", 300e-6), ("7ns", 7e-9), ("-2s", -2.0), ("+2m", 120.0), ("2h45m30.5s", 9930.5),
    ("-0", 0.0), ("+0", 0.0),
])
def test_go_durations(text, seconds):
    assert go_duration(text) == pytest.approx(seconds)


@pytest.mark.parametrize("text", ["", "5", "1d", "s", ".s", "5 s", "1h 30m", "--5s", "++5s", "+-5s", "1.2.3s", "-", "00"])
def test_go_refuses_other_durations(text):
    with pytest.raises(ValueError):
        go_duration(text)


def test_url_lists_as_etcd_checks_them():
    assert go_urls("https://127.0.0.1:2379,https://10.0.0.1:2379,https://127.0.0.1:2379") == [
        "https://127.0.0.1:2379", "https://10.0.0.1:2379"]
    assert go_urls("unix://sock:0") == ["unix://sock:0"]
    for bad, reason in (("localhost:2379", "URL scheme must be"), ("ftp://h:1", "URL scheme must be"),
                        ("http://h", 'does not have the form "host:port"'), ("http://h:1/x", "must not contain a path"),
                        ("http://h:1/", "must not contain a path")):
        with pytest.raises(ValueError, match=reason):
            go_urls(bad)
    assert go_urls("*", allow_star=True) == ["*"]


def test_flag_syntax_is_gos():
    argv = ["-name", "n1", "--data-dir=/d", "-client-cert-auth", "--max-txn-ops", "0x20", "--log-level", "info"]
    c = config(argv)
    assert (c.name, str(c.data_dir), c.client_cert_auth, c.max_txn_ops) == ("n1", "/d", True, 32)
    assert config(["--client-cert-auth=false"]).client_cert_auth is False
    assert config(["--client-cert-auth=1"]).client_cert_auth is True
    assert config(["--data-dir", "-odd"]).data_dir.name == "-odd"  # a value may start with a dash, as in Go
    assert config(["--name=a", "--name=b"]).name == "b"  # the last one counts
    assert config(["--name=a", "--"]).name == "a"  # "--" ends the flags


@pytest.mark.parametrize("argv, code, message", [
    (["--foo"], 2, "flag provided but not defined: -foo"),
    (["--data"], 2, "flag provided but not defined: -data"),  # no abbreviations, as Go
    (["-name"], 2, "flag needs an argument: -name"),
    (["---name=x"], 2, "bad flag syntax: ---name=x"),
    (["-=x"], 2, "bad flag syntax: -=x"),
    (["--snapshot-count=abc"], 2, 'invalid value "abc" for flag -snapshot-count: parse error'),
    (["--client-cert-auth=yes"], 2, 'invalid boolean value "yes" for -client-cert-auth: parse error'),
    (["--client-cert-auth", "true"], 1, "'true' is not a valid flag"),
    (["--name", "a", "extra"], 1, "'extra' is not a valid flag"),
    (["--", "--name=a"], 1, "'--name=a' is not a valid flag"),
    (["--listen-client-urls=localhost:2379"], 2,
     'invalid value "localhost:2379" for flag -listen-client-urls: URL scheme must be http, https, unix, or unixs: '
     "localhost:2379"),
    (["--initial-cluster-state=old"], 2, 'invalid value "old" for flag -initial-cluster-state: invalid value'),
    (["--journal-fsync=sometimes"], 2, 'invalid value "sometimes" for flag -journal-fsync: want one of always, '
                                       "batch, off"),
    (["--max-request-bytes=-1"], 2, 'invalid value "-1" for flag -max-request-bytes: parse error'),
    (["--max-txn-ops=x", "--foo"], 2, 'invalid value "x" for flag -max-txn-ops: parse error'),  # in order, as Go
    (["--snapshot-count=abc", "--snapshot-count=5"], 2, 'invalid value "abc" for flag -snapshot-count: parse error'),
    # what etcd checks once the line is parsed comes after every flag's own type (exit 1)
    (["--auth-token=bogus", "--snapshot-count=x"], 2, 'invalid value "x" for flag -snapshot-count: parse error'),
    (["--log-level=5s", "--enable-pprof=*"], 2, 'invalid boolean value "*" for -enable-pprof: parse error'),
    (["--auto-compaction-mode", "-x", "1e3"], 1, "'1e3' is not a valid flag"),
    (["--log-level=loud"], 1, 'invalid value "loud" for flag -log-level: want one of debug, info, warn, error'),
])
def test_command_line_refusals_in_gos_words(argv, code, message):
    e = refused(argv)
    assert (e.code, str(e)) == (code, message)


def test_help_and_version():
    assert read(["-h"]).help and read(["--help"]).help
    assert read(["--version"]).version and read(["-version=true"]).version and not read(["--version=false"]).version


def test_environment_fills_flags_not_on_the_command_line():
    c = config(["--name", "fromflag"], {"ETCD_DATA_DIR": "/from/env", "ETCD_CLIENT_CERT_AUTH": "true",
                                        "ETCD_MAX_TXN_OPS": "0x40", "ETCD_LISTEN_METRICS_URLS": ""})
    assert (c.name, str(c.data_dir), c.client_cert_auth, c.max_txn_ops, c.listen_metrics_urls) == (
        "fromflag", "/from/env", True, 64, ())
    r = read([], {"ETCD_FOO": "1", "ETCD_VERSION": "3", "ETCDCTL_API": "3", "ETCD_SNAPSHOT_COUNT": "5"})
    assert r.warnings == ["unrecognized environment variable variable=ETCD_FOO",
                          "cannot set special environment variable key=ETCD_VERSION"]
    assert r.no_effect() == ["snapshot-count"] and not r.version


def test_environment_refusals_as_etcds():
    e = refused([], {"ETCD_SNAPSHOT_COUNT": "abc"})
    assert (e.code, str(e)) == (1, 'invalid value "abc" for ETCD_SNAPSHOT_COUNT: parse error')
    e = refused(["--name", "a"], {"ETCD_NAME": "b"})
    assert e.code == 1 and "ETCD_NAME" in str(e) and "--name" in str(e)
    assert read(["--name", "a"], {"ETCD_NAME": ""}).argv == ["--name=a"]  # empty: not set
    e = refused([], {"ETCD_CLIENT_CERT_AUTH": "yes"})
    assert (e.code, str(e)) == (1, 'invalid value "yes" for ETCD_CLIENT_CERT_AUTH: parse error')


def test_unsafe_no_fsync_turns_the_journals_fsync_off():
    assert config(["--unsafe-no-fsync"]).journal_fsync == "off"
    assert config(["--unsafe-no-fsync=false"]).journal_fsync == "always"
    assert config(["--unsafe-no-fsync", "--journal-fsync=batch"]).journal_fsync == "batch"
    assert config([]).journal_fsync == "always"


def test_etcd_log_levels_and_zero_keepalives():
    assert config(["--log-level=fatal"]) is not None and read(["--log-level=panic"]).argv == ["--log-level=error"]
    c = config(["--grpc-keepalive-interval=0", "--grpc-keepalive-timeout=0s"])
    assert (c.grpc_keepalive_interval_s, c.grpc_keepalive_timeout_s) == (0, 0)
    c = config(["--grpc-keepalive-min-time=0", "--experimental-watch-progress-notify-interval=0s",
                "--experimental-warning-apply-duration=0"])  # etcd's and grpc-go's defaults; 0: every request
    assert (c.grpc_keepalive_min_time_s, c.watch_progress_notify_interval_s, c.warning_apply_duration_s) == (
        300, 600, 0)
    assert config(["--experimental-watch-progress-notify-interval=1m30s"]).watch_progress_notify_interval_s == 90


KUBEADM = [  # kubeadm's etcd static pod command line (etcd 3.5), paths and addresses aside
    "--advertise-client-urls=https://10.0.0.1:2379", "--cert-file=/pki/server.crt", "--client-cert-auth=true",
    "--data-dir=/var/lib/etcd", "--experimental-initial-corrupt-check=true",
    "--experimental-watch-progress-notify-interval=5s", "--initial-advertise-peer-urls=https://10.0.0.1:2380",
    "--initial-cluster=node1=https://10.0.0.1:2380", "--key-file=/pki/server.key",
    "--listen-client-urls=https://127.0.0.1:2379,https://10.0.0.1:2379", "--listen-metrics-urls=http://127.0.0.1:2381",
    "--listen-peer-urls=https://10.0.0.1:2380", "--name=node1", "--peer-cert-file=/pki/peer.crt",
    "--peer-client-cert-auth=true", "--peer-key-file=/pki/peer.key", "--peer-trusted-ca-file=/pki/ca.crt",
    "--snapshot-count=10000", "--trusted-ca-file=/pki/ca.crt",
]


def test_kubeadms_command_line_is_applied():
    r = read(KUBEADM)
    assert refusal(r, ()) is None
    assert r.no_effect() == ["experimental-initial-corrupt-check", "initial-cluster", "listen-peer-urls",
                             "peer-cert-file", "peer-client-cert-auth", "peer-key-file", "peer-trusted-ca-file",
                             "snapshot-count"]
    c = config_from_args(PARSER.parse_args(r.argv))
    assert c.listen_client_urls == ("https://127.0.0.1:2379", "https://10.0.0.1:2379")
    assert c.advertise_client_urls == ("https://10.0.0.1:2379",) and c.listen_metrics_urls == ("http://127.0.0.1:2381",)
    assert (str(c.cert_file), str(c.key_file), str(c.trusted_ca_file), c.client_cert_auth) == (
        "/pki/server.crt", "/pki/server.key", "/pki/ca.crt", True)
    assert (c.name, str(c.data_dir), c.watch_progress_notify_interval_s) == ("node1", "/var/lib/etcd", 5.0)


@pytest.mark.parametrize("argv, why", [
    (["--initial-cluster=a=https://h1:2380,b=https://h2:2380,c=https://h3:2380"], "a database of its own"),
    (["--discovery-srv=example.com"], "a database of its own"),
    (["--auto-tls"], "no certificates"),
    (["--host-whitelist=example.com"], "Host header"),
    (["--cors=https://example.com:443"], "every origin"),
    (["--enable-grpc-gateway=false"], "gateway"),
    (["--proxy=on"], "proxy"),
    (["--enable-v2"], "v3 API only"),
])
def test_flags_whose_loss_would_matter_are_refused(argv, why):
    reason = refusal(read(argv), ())
    assert reason is not None and why in reason


def test_cipher_suites_by_gos_names():
    c = config(["--cipher-suites=TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256,TLS_ECDHE_RSA_WITH_CHACHA20_POLY1305,"
                "TLS_AES_128_GCM_SHA256"])
    assert c.cipher_suites == ("TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256", "TLS_ECDHE_RSA_WITH_CHACHA20_POLY1305",
                               "TLS_AES_128_GCM_SHA256")
    e = refused(["--cipher-suites=TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256,TLS_BOGUS"])
    assert (e.code, str(e)) == (1, 'invalid value "TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256,TLS_BOGUS" for flag '
                                   '-cipher-suites: unexpected TLS cipher suite "TLS_BOGUS"')
    assert "cipher-suites" in read(["--cipher-suites=TLS_AES_128_GCM_SHA256"]).applied


def test_what_is_not_refused():
    for argv in (["--initial-cluster=node1=https://h1:2380"], ["--initial-cluster=a=https://h1:2380,a=https://h2:2380"],
                 ["--cors=*"], ["--host-whitelist=*"], ["--enable-grpc-gateway"], ["--proxy=off"], ["--enable-v2=false"],
                 ["--v", "--config=x", "--force-new-cluster", "--wal-dir=/w", "--metrics=extensive"]):
        assert refusal(read(argv), ()) is None, argv
    # several processes on one replicated journal: a cluster's members are a writer and its standbys
    assert refusal(read(["--initial-cluster=a=https://h1:2380,b=https://h2:2380"]), ("nats://n:4222",)) is None


def test_every_etcd_flag_is_accepted_with_a_valid_value():
    samples = {"bool": "true", "int": "1", "int64": "1", "uint": "1", "uint64": "1", "duration": "1s",
               "urls": "http://127.0.0.1:1", "origins": "*", "strings": "a", "ignored": "x", "string": "s"}
    for name, kind in FLAGS.items():
        value = {"initial-cluster-state": "new", "discovery-fallback": "exit", "proxy": "off",
                 "v2-deprecation": "not-yet", "log-level": "info", "auto-compaction-mode": "periodic",
                 "auto-compaction-retention": "1", "auth-token": "simple", "bcrypt-cost": "10",
                 "cipher-suites": "TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256",
                 "config-file": None}.get(name, samples.get(kind))
        if value is None:
            continue
        read([f"--{name}={value}"])


def test_configuration_file(tmp_path):
    f = tmp_path / "etcd.yaml"
    f.write_text("""
name: fromfile
data-dir: /from/file
listen-client-urls: https://127.0.0.1:2379
max-txn-ops: 256
grpc-keepalive-interval: 5000000000
experimental-watch-progress-notify-interval: 1500000000
snapshot-count: 10000
log-outputs: [stderr]
unknown-key: 3
client-transport-security:
  cert-file: /pki/server.crt
  key-file: /pki/server.key
  client-cert-auth: true
  trusted-ca-file: /pki/ca.crt
peer-transport-security:
  client-cert-auth: true
journal-fsync: batch
""")
    r = read(["--config-file", str(f), "--name=ignored", "--shard-layout=/l.toml"], {"ETCD_MAX_TXN_OPS": "9"})
    c = config_from_args(PARSER.parse_args(r.argv))
    assert (c.name, str(c.data_dir), c.max_txn_ops, c.grpc_keepalive_interval_s, c.watch_progress_notify_interval_s) \
        == ("fromfile", "/from/file", 256, 5.0, 1.5)
    assert (str(c.cert_file), str(c.trusted_ca_file), c.client_cert_auth) == ("/pki/server.crt", "/pki/ca.crt", True)
    assert c.journal_fsync == "batch" and str(c.shard_layout) == "/l.toml"  # shardetcd's own, file and flag
    assert r.no_effect() == ["peer-client-cert-auth", "snapshot-count"]
    assert PARSER.parse_args(r.argv).log_outputs == ("stderr",)  # a YAML list, as etcd's file gives it
    assert any("key=unknown-key" in w for w in r.warnings) and any("flags=name" in w for w in r.warnings)
    assert read([], {"ETCD_CONFIG_FILE": str(f)}).config_file == str(f)


@pytest.mark.parametrize("text, why", [
    ("grpc-keepalive-interval: 5s", "cannot unmarshal string into Go struct field configYAML.grpc-keepalive-interval "
                                    "of type time.Duration"),
    ('max-txn-ops: "12"', "cannot unmarshal string into Go struct field configYAML.max-txn-ops of type uint"),
    ("client-cert-auth: 1", "cannot unmarshal number into Go struct field configYAML.client-cert-auth of type bool"),
    ("name: [a]", "cannot unmarshal array into Go struct field configYAML.name of type string"),
    ("listen-client-urls: localhost", "URL scheme must be"),
    ("- a\n- b", "want a mapping"),
    ("a: [", "not YAML"),
])
def test_configuration_file_refusals(tmp_path, text, why):
    f = tmp_path / "etcd.yaml"
    f.write_text(text + "\n")
    e = refused(["--config-file", str(f)])
    assert e.code == 1 and why in str(e), str(e)
    assert "cannot read" in str(refused(["--config-file", str(tmp_path / "missing.yaml")]))


def test_cipher_suites_reach_the_tls_context(tmp_path):
    import ssl

    from shim.server import StartupError, tls_credentials
    from tests.tls_certs import make_pki

    pki = make_pki(tmp_path / "pki")
    tls = ["--cert-file", str(pki["server"]), "--key-file", str(pki["server-key"])]
    ctx = tls_credentials(config([*tls, "--cipher-suites=TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256,TLS_RSA_WITH_RC4_128_SHA"]))
    assert isinstance(ctx, ssl.SSLContext)
    tls12 = {c["name"] for c in ctx.get_ciphers() if c["protocol"] == "TLSv1.2"}
    assert tls12 == {"ECDHE-ECDSA-AES128-GCM-SHA256"}  # RC4: not in this OpenSSL, left out
    for argv, why in ((["--cipher-suites=TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384"], "HTTP/2-required"),
                      (["--cipher-suites=TLS_AES_128_GCM_SHA256"], "HTTP/2-required"),
                      (["--cipher-suites=TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256", "--grpc-server=grpcio"], "native")):
        with pytest.raises(StartupError, match=why):
            tls_credentials(config([*tls, *argv]))


def test_certificate_checks(tmp_path):
    from cryptography import x509

    from shim.peercheck import CertificateCheck, names_host
    from tests.tls_certs import make_pki, write_crl

    pki = make_pki(tmp_path / "pki", client_dns=("a.example.com", "*.wild.example.com"))
    der = {n: x509.load_pem_x509_certificate(pki[n].read_bytes()).public_bytes(
        __import__("cryptography.hazmat.primitives.serialization", fromlist=["Encoding"]).Encoding.DER)
        for n in ("client", "client-dns:a.example.com", "client-dns:*.wild.example.com")}
    crl = write_crl(tmp_path / "crl.pem", pki, (pki["client"],))
    check = CertificateCheck(crl_file=crl)
    assert check(der["client"]).startswith("certificate serial ") and check(der["client-dns:a.example.com"]) is None
    assert check(None) is None  # no certificate: nothing to revoke (--client-cert-auth refuses it)
    host = CertificateCheck(allowed_hostname="A.example.com.")
    assert host(der["client-dns:a.example.com"]) is None
    assert host(der["client"]) == host(None) == "client certificate authentication failed"
    wild = x509.load_pem_x509_certificate(pki["client-dns:*.wild.example.com"].read_bytes())
    assert names_host(wild, "x.wild.example.com") and not names_host(wild, "wild.example.com")
    assert not names_host(wild, "a.b.wild.example.com")
    with pytest.raises(ValueError):
        CertificateCheck(crl_file=pki["ca"])  # a certificate, not a revocation list
