"""etcd 3.5's server command line, read the way etcd reads it.

An operator swaps etcd for shardetcd in a manifest that already exists (kubeadm's static
pod, a systemd unit, a Helm chart) and keeps its command line: Go's flag syntax
(``-flag``, ``--flag=value``, ``--flag value``, ``--bool``, ``--bool=false``), every flag
etcd 3.5.1 defines, and the ``ETCD_*`` environment variables etcd reads for flags not on
the command line. ``normalize`` reads such a command line and hands the server's argparse
parser a canonical one (``--name=value``), so the parser stays the one registry of
shardetcd's own options, their types and their help.

Each etcd flag is one of:

* **applied**: shardetcd has the same knob under the same name (an option of the parser);
* **refused**: ignoring it would weaken a security control or change what clients see
  (generated certificates, a Host header check, a multi-member Raft bootstrap with a local
  journal, ...): the start is refused with one line saying why;
* **no effect**: Raft's, peers', bbolt's and logging plumbing's knobs. They are checked
  as etcd checks them (a value etcd refuses is refused) and named in one log line.

Errors read as Go's flag package and etcd write them; a command-line error exits 2, an
environment error or a refusal exits 1, as etcd 3.5.1 does.
"""
from __future__ import annotations

import argparse
import ipaddress
import os
import re
from dataclasses import dataclass, field

from shards.durations import go_duration_s

# etcd 3.5.1's flags (etcdmain's flag set, probed against the binary), by kind.
_KINDS = {
    "string": """config-file data-dir wal-dir name backend-bbolt-freelist-type discovery discovery-proxy
        discovery-srv discovery-srv-name initial-cluster initial-cluster-token experimental-enable-v2v3 cert-file
        key-file client-cert-file client-key-file client-crl-file client-cert-allowed-hostname trusted-ca-file
        peer-cert-file peer-key-file peer-client-cert-file peer-client-key-file peer-trusted-ca-file peer-crl-file
        peer-cert-allowed-cn peer-cert-allowed-hostname logger log-level log-rotation-config-json
        auto-compaction-retention auto-compaction-mode metrics experimental-distributed-tracing-address
        experimental-distributed-tracing-service-name experimental-distributed-tracing-instance-id auth-token""",
    "bool": """initial-election-tick-advance socket-reuse-port socket-reuse-address strict-reconfig-check pre-vote
        enable-v2 client-cert-auth auto-tls peer-client-cert-auth peer-auto-tls
        experimental-peer-skip-client-san-verification enable-log-rotation version enable-pprof
        experimental-enable-distributed-tracing enable-grpc-gateway experimental-initial-corrupt-check
        experimental-enable-lease-checkpoint experimental-memory-mlock experimental-txn-mode-write-with-shared-buffer
        unsafe-no-fsync force-new-cluster""",
    "int": "backend-batch-limit experimental-compaction-batch-limit",
    "int64": "quota-backend-bytes",
    "uint": """max-snapshots max-wals heartbeat-interval election-timeout max-txn-ops max-request-bytes
        proxy-failure-wait proxy-refresh-interval proxy-dial-timeout proxy-write-timeout proxy-read-timeout
        self-signed-cert-validity bcrypt-cost auth-token-ttl experimental-bootstrap-defrag-threshold-megabytes""",
    "uint64": "snapshot-count",
    "duration": """backend-batch-interval grpc-keepalive-min-time grpc-keepalive-interval grpc-keepalive-timeout
        raft-read-timeout raft-write-timeout experimental-corrupt-check-time experimental-watch-progress-notify-interval
        experimental-downgrade-check-time experimental-warning-apply-duration""",
    "urls": "listen-peer-urls listen-client-urls listen-metrics-urls initial-advertise-peer-urls advertise-client-urls",
    "origins": "cors",  # URLs, or *
    "strings": "cipher-suites host-whitelist log-outputs",
    "choice": "discovery-fallback initial-cluster-state proxy v2-deprecation",
    # flags etcd keeps defined, and ignores, for old command lines: any value, or none
    "ignored": """cluster-active-size cluster-remove-delay cluster-sync-interval config force max-result-buffer
        max-retry-attempts peer-heartbeat-interval peer-election-timeout retry-interval snapshot v vv
        test.coverprofile test.outputdir""",
}
FLAGS: dict[str, str] = {name: kind for kind, names in _KINDS.items() for name in names.split()}
CHOICES = {
    "discovery-fallback": ("proxy", "exit"),
    "initial-cluster-state": ("new", "existing"),
    "proxy": ("off", "readonly", "on"),
    "v2-deprecation": ("not-yet", "write-only", "write-only-drop-data", "gone"),
}
# etcd's log levels beyond shardetcd's four: the process logs errors and worse alike
LOG_LEVELS = {"debug": "debug", "info": "info", "warn": "warn", "error": "error",
              "dpanic": "error", "panic": "error", "fatal": "error"}

# --cipher-suites: the names etcd 3.5 takes (Go's crypto/tls names, insecure ones included, and two
# older spellings) and OpenSSL's name for each TLS 1.2 suite; TLS 1.3's are taken and, as in Go,
# change nothing (TLS 1.3 always offers all three).
CIPHER_SUITES = {
    "TLS_RSA_WITH_AES_128_CBC_SHA": "AES128-SHA", "TLS_RSA_WITH_AES_256_CBC_SHA": "AES256-SHA",
    "TLS_RSA_WITH_AES_128_GCM_SHA256": "AES128-GCM-SHA256", "TLS_RSA_WITH_AES_256_GCM_SHA384": "AES256-GCM-SHA384",
    "TLS_ECDHE_ECDSA_WITH_AES_128_CBC_SHA": "ECDHE-ECDSA-AES128-SHA",
    "TLS_ECDHE_ECDSA_WITH_AES_256_CBC_SHA": "ECDHE-ECDSA-AES256-SHA",
    "TLS_ECDHE_RSA_WITH_AES_128_CBC_SHA": "ECDHE-RSA-AES128-SHA", "TLS_ECDHE_RSA_WITH_AES_256_CBC_SHA": "ECDHE-RSA-AES256-SHA",
    "TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256": "ECDHE-ECDSA-AES128-GCM-SHA256",
    "TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384": "ECDHE-ECDSA-AES256-GCM-SHA384",
    "TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256": "ECDHE-RSA-AES128-GCM-SHA256",
    "TLS_ECDHE_RSA_WITH_AES_256_GCM_SHA384": "ECDHE-RSA-AES256-GCM-SHA384",
    "TLS_ECDHE_RSA_WITH_CHACHA20_POLY1305_SHA256": "ECDHE-RSA-CHACHA20-POLY1305",
    "TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305_SHA256": "ECDHE-ECDSA-CHACHA20-POLY1305",
    "TLS_ECDHE_RSA_WITH_CHACHA20_POLY1305": "ECDHE-RSA-CHACHA20-POLY1305",
    "TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305": "ECDHE-ECDSA-CHACHA20-POLY1305",
    "TLS_RSA_WITH_RC4_128_SHA": "RC4-SHA", "TLS_RSA_WITH_3DES_EDE_CBC_SHA": "DES-CBC3-SHA",
    "TLS_RSA_WITH_AES_128_CBC_SHA256": "AES128-SHA256", "TLS_ECDHE_ECDSA_WITH_RC4_128_SHA": "ECDHE-ECDSA-RC4-SHA",
    "TLS_ECDHE_RSA_WITH_RC4_128_SHA": "ECDHE-RSA-RC4-SHA", "TLS_ECDHE_RSA_WITH_3DES_EDE_CBC_SHA": "ECDHE-RSA-DES-CBC3-SHA",
    "TLS_ECDHE_ECDSA_WITH_AES_128_CBC_SHA256": "ECDHE-ECDSA-AES128-SHA256",
    "TLS_ECDHE_RSA_WITH_AES_128_CBC_SHA256": "ECDHE-RSA-AES128-SHA256",
    "TLS_AES_128_GCM_SHA256": None, "TLS_AES_256_GCM_SHA384": None, "TLS_CHACHA20_POLY1305_SHA256": None,
}


def cipher_suites(text: str) -> tuple[str, ...]:
    """--cipher-suites: comma-separated Go names, each one etcd knows."""
    names = tuple(n for n in text.split(",") if n)
    for n in names:
        if n not in CIPHER_SUITES:
            raise argparse.ArgumentTypeError(f'unexpected TLS cipher suite "{n}"')
    return names


_GO_BOOLS = {"1": True, "t": True, "T": True, "TRUE": True, "true": True, "True": True,
             "0": False, "f": False, "F": False, "FALSE": False, "false": False, "False": False}
_INT_BITS = {"int": (64, True), "int64": (64, True), "uint": (64, False), "uint64": (64, False)}


class FlagError(Exception):
    """A command line or environment etcd would refuse; ``code`` is etcd's exit status."""

    def __init__(self, message: str, code: int) -> None:
        super().__init__(message)
        self.code = code


def go_bool(text: str) -> bool:
    """Go's strconv.ParseBool."""
    try:
        return _GO_BOOLS[text]
    except KeyError:
        raise ValueError("parse error") from None


def go_int(text: str, kind: str) -> int:
    """Go's strconv.ParseInt (int, int64) or ParseUint (uint, uint64) with base 0: 0x, 0o, 0b, or a
    leading 0 (octal) as prefix, and _ between digits (or after a prefix), as in Go's literals."""
    bits, signed = _INT_BITS[kind]
    s, negative = text, False
    if s[:1] in ("+", "-"):
        if not signed:
            raise ValueError("parse error")
        negative, s = s[0] == "-", s[1:]
    base, prefixed = 10, False
    if len(s) > 1 and s[0] == "0":
        base = {"x": 16, "o": 8, "b": 2}.get(s[1].lower(), 8)
        s, prefixed = (s[2:] if base != 8 or s[1].lower() == "o" else s[1:]), True
    if not re.fullmatch(r"_?[0-9a-zA-Z]+(?:_[0-9a-zA-Z]+)*" if prefixed else r"[0-9]+(?:_[0-9]+)*", s):
        raise ValueError("parse error")
    try:
        value = int(s.replace("_", ""), base)
    except ValueError:
        raise ValueError("parse error") from None
    value = -value if negative else value
    low, high = (-(1 << (bits - 1)), (1 << (bits - 1)) - 1) if signed else (0, (1 << bits) - 1)
    if not low <= value <= high:
        raise ValueError("value out of range")
    return value


def go_urls(text: str, allow_star: bool = False) -> list[str]:
    """etcd's URL list flags: comma-separated http, https, unix or unixs URLs of host:port, no path."""
    if allow_star and text in ("", "*"):
        return ["*"]
    out = []
    for u in text.split(","):
        scheme, sep, rest = u.partition("://")
        if not sep or scheme not in ("http", "https", "unix", "unixs"):
            raise ValueError(f"URL scheme must be http, https, unix, or unixs: {u}")
        host, slash, _ = rest.partition("/")
        if not re.fullmatch(r"(\[[^\]]*\]|[^:\[\]]*):[^:]*", host.partition("?")[0]):
            raise ValueError(f'URL address does not have the form "host:port": {u}')
        if slash:
            raise ValueError(f"URL must not contain a path: {u}")
        if u not in out:
            out.append(u)
    return out


def check_value(name: str, kind: str, text: str) -> object:
    """The value etcd would store for ``--name=text``; ValueError with Go's reason if it would refuse it."""
    if kind == "bool":
        return go_bool(text)
    if kind in _INT_BITS:
        return go_int(text, kind)
    if kind == "duration":
        try:
            return go_duration_s(text)
        except ValueError:
            raise ValueError("parse error") from None
    if kind == "urls":
        return go_urls(text) if text else []
    if kind == "origins":
        return go_urls(text, allow_star=True)
    if kind == "strings":
        return [s for s in text.split(",") if s] if text else []
    if kind == "choice":
        if text not in CHOICES[name]:
            raise ValueError("invalid value" if name != "v2-deprecation" else f'invalid value "{text}"')
        return text
    return text  # string, ignored


@dataclass
class Reading:
    """What a command line and the environment said."""

    argv: list[str] = field(default_factory=list)  # canonical, for the server's argparse parser
    etcd: dict[str, object] = field(default_factory=dict)  # etcd flags given, by name, as etcd reads them
    warnings: list[str] = field(default_factory=list)  # for the log, once logging is set up
    applied: set[str] = field(default_factory=set)  # etcd flags given that an option here takes
    version: bool = False
    help: bool = False
    config_file: str | None = None

    def no_effect(self) -> list[str]:
        """etcd flags given that no option here takes (refused ones are refused before this matters)."""
        return sorted(n for n in self.etcd if n not in self.applied and n not in _HANDLED)


def _options(parser: argparse.ArgumentParser) -> tuple[dict[str, argparse.Action], set[str]]:
    """The parser's long options by name (without dashes), and which of them are switches."""
    options, switches = {}, set()
    for action in parser._actions:
        for opt in action.option_strings:
            if opt.startswith("--"):
                options[opt[2:]] = action
                if action.nargs == 0:
                    switches.add(opt[2:])
    return options, switches


def _convert(action: argparse.Action, text: str) -> None:
    """Check ``text`` with the parser's own type and choices; ValueError saying why if refused."""
    try:
        value = action.type(text) if action.type is not None else text
    except (argparse.ArgumentTypeError, TypeError) as exc:
        raise ValueError(str(exc)) from None
    if action.choices is not None and value not in action.choices:
        raise ValueError(f"want one of {', '.join(map(str, action.choices))}")


def _canonical(name: str, kind: str | None, text: str) -> str:
    """The text handed on to argparse for an applied etcd flag (Go's numbers in decimal, etcd's log levels)."""
    if kind in _INT_BITS:
        return str(go_int(text, kind))
    if name == "log-level":
        return LOG_LEVELS.get(text, text)
    return text


def normalize(argv: list[str], parser: argparse.ArgumentParser, environ: dict[str, str] | None = None) -> Reading:
    """Read ``argv`` as etcd's flag set would, then the ETCD_* environment; see the module doc."""
    environ = os.environ if environ is None else environ
    options, switches = _options(parser)
    reading = Reading()
    given: dict[str, str | None] = {}  # name -> raw text (None: a switch given bare)
    args = list(argv)
    while args:
        arg = args.pop(0)
        if len(arg) < 2 or arg[0] != "-":
            args.insert(0, arg)
            break
        dashes = 2 if arg[1] == "-" else 1
        body = arg[dashes:]
        if dashes == 2 and not body:  # "--": the end of the flags
            break
        if not body or body[0] in "-=":
            raise FlagError(f"bad flag syntax: {arg}", 2)
        name, has_value, text = body.partition("=")
        if name in ("h", "help"):
            reading.help = True
            continue
        kind = FLAGS.get(name)
        if kind is None and name not in options:
            raise FlagError(f"flag provided but not defined: -{name}", 2)
        switch = name in switches or kind in ("bool", "ignored")
        if not has_value and not switch:
            if not args:
                raise FlagError(f"flag needs an argument: -{name}", 2)
            text, has_value = args.pop(0), True
        given[name] = text if has_value else None
        # checked in order as Go's flag package sets each: its types here; what etcd checks of a
        # value after parsing (an auth token's options, a log level) comes after the whole line
        _take(Reading(), name, given[name], options, switches, "flag", meaning=kind is None)
    if args:  # etcd: anything after the flags is a mistake
        raise FlagError(f"'{args[0]}' is not a valid flag", 1)

    config_file = given.get("config-file") or environ.get("ETCD_CONFIG_FILE")
    if config_file:  # etcd: the file alone, command-line flags and ETCD_* ignored
        reading.config_file = config_file
        _read_config_file(reading, config_file, options, switches)
        ignored = sorted(n for n in given if n in FLAGS and n != "config-file")
        if ignored:
            reading.warnings.append("loaded the configuration file; these command-line flags are ignored, as etcd "
                                    f"ignores them beside one path={config_file} flags={','.join(ignored)}")
        for name, text in given.items():  # shardetcd's own flags: no place in etcd's file, so still read
            if name not in FLAGS:
                _take(reading, name, text, options, switches, "flag")
    else:
        for name, text in given.items():
            _take(reading, name, text, options, switches, "flag")
        _read_environment(reading, environ, options, switches, set(given))
    if reading.etcd.get("unsafe-no-fsync") and not any(a.startswith("--journal-fsync=") for a in reading.argv):
        reading.argv.append("--journal-fsync=off")  # etcd's knob for the same trade
    return reading


def _refused(source: str, name: str, kind: str | None, raw: str, reason: str, after_parsing: bool = False
             ) -> FlagError:
    """A value refused, in the words etcd uses for where it came from; ``after_parsing``: by a check
    etcd makes once its flags are parsed (exit 1, as etcd's "failed to verify flags")."""
    if source == "flag":  # Go's flag package
        if after_parsing:
            return FlagError(f'invalid value "{raw}" for flag -{name}: {reason}', 1)
        if kind == "bool":
            return FlagError(f'invalid boolean value "{raw}" for -{name}: {reason}', 2)
        return FlagError(f'invalid value "{raw}" for flag -{name}: {reason}', 2)
    if source.startswith("ETCD_"):  # etcd's flags.SetFlagsFromEnv
        return FlagError(f'invalid value "{raw}" for {source}: {reason}', 1)
    return FlagError(f'{source}: invalid value "{raw}" for {name}: {reason}', 1)


def _take(reading: Reading, name: str, text: str | None, options, switches, source: str,
          meaning: bool = True) -> None:
    """Record one flag's value (``text`` None: a switch given bare) and hand an option here its
    text; ``meaning``: also check it with the option's own type (what etcd checks after parsing)."""
    kind = FLAGS.get(name)
    raw = "true" if text is None else text
    if kind is not None:
        try:
            reading.etcd[name] = True if kind == "ignored" else check_value(name, kind, raw)
        except ValueError as exc:
            raise _refused(source, name, kind, raw, str(exc)) from None
    if name == "version":
        reading.version = reading.etcd["version"] is True
        return
    action = options.get(name)
    if action is None:
        return
    if kind is not None:
        reading.applied.add(name)
    if name in switches:
        try:
            on = go_bool(raw)
        except ValueError as exc:
            raise _refused(source, name, "bool", raw, str(exc)) from None
        if on:
            reading.argv.append(f"--{name}")
        return
    if kind == "urls" and raw == "":
        return  # etcd: an empty list, which is the default here
    canonical = _canonical(name, kind, raw)
    if not meaning:
        return
    try:
        _convert(action, canonical)
    except ValueError as exc:
        raise _refused(source, name, None, raw, str(exc), after_parsing=kind is not None) from None
    reading.argv.append(f"--{name}={canonical}")


def env_key(name: str) -> str:
    return "ETCD_" + name.upper().replace("-", "_")


def _read_environment(reading: Reading, environ, options, switches, on_command_line: set[str]) -> None:
    """etcd's flags.SetFlagsFromEnv: ETCD_<FLAG> for a flag not on the command line."""
    keys = {env_key(name): name for name in FLAGS}
    for key in sorted(k for k in environ if k.startswith("ETCD_")):
        if key == "ETCD_VERSION":
            reading.warnings.append(f"cannot set special environment variable key={key}")
            continue
        name = keys.get(key)
        if name is None:
            reading.warnings.append(f"unrecognized environment variable variable={key}")
            continue
        value = environ[key]
        if not value:
            continue  # etcd: an empty variable is not set
        if name in on_command_line:
            raise FlagError(f"conflicting environment variable {key} is shadowed by the command-line flag "
                            f"--{name} (unset one of them)", 1)
        _take(reading, name, value, options, switches, key)


# etcd's configuration file (--config-file): YAML read as JSON into etcd's Config, so each value
# has its JSON type (a duration is a number of nanoseconds); keys are the flag names, TLS ones
# nested under client-transport-security and peer-transport-security; other keys are ignored.
_SECURITY_KEYS = ("cert-file", "key-file", "client-cert-file", "client-key-file", "client-cert-auth",
                  "trusted-ca-file", "auto-tls")
_GO_TYPES = {"bool": "bool", "int": "int", "int64": "int64", "uint": "uint", "uint64": "uint64",
             "duration": "time.Duration", "strings": "[]string"}


def _json_type(value: object) -> str:
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, (int, float)):
        return "number"
    if isinstance(value, str):
        return "string"
    return "array" if isinstance(value, list) else "object"


def _file_text(key: str, kind: str, value: object) -> str:
    """A config file value as the flag text etcd's Config field would hold; ValueError if JSON would refuse it."""
    want = {"bool": "bool", "duration": "number", "strings": "array"}.get(kind, "number" if kind in _INT_BITS
                                                                              else "string")
    got = _json_type(value)
    if got != want or got == "number" and not isinstance(value, int) or kind == "strings" and not all(
            isinstance(v, str) for v in value):
        raise ValueError(f"cannot unmarshal {got} into Go struct field configYAML.{key} of type "
                         f"{_GO_TYPES.get(kind, 'string')}")
    if kind == "bool":
        return "true" if value else "false"
    if kind == "duration":
        return f"{value}ns"
    if kind == "strings":
        return ",".join(value)
    return str(value)


def _read_config_file(reading: Reading, path: str, options, switches) -> None:
    import yaml

    try:
        with open(path, encoding="utf-8") as f:
            doc = yaml.safe_load(f)
    except OSError as exc:
        raise FlagError(f"cannot read the configuration file {path}: {exc.strerror or exc}", 1) from None
    except (yaml.YAMLError, UnicodeDecodeError) as exc:
        raise FlagError(f"configuration file {path}: not YAML: {' '.join(str(exc).split())}", 1) from None
    if doc is None:
        return
    if not isinstance(doc, dict):
        raise FlagError(f"configuration file {path}: cannot unmarshal {_json_type(doc)} into the configuration "
                        "(want a mapping of settings)", 1)
    flat: dict[str, object] = {}
    for key, value in doc.items():
        key = str(key)
        if key in ("client-transport-security", "peer-transport-security") and isinstance(value, dict):
            prefix = "" if key.startswith("client") else "peer-"
            flat.update((prefix + str(k), v) for k, v in value.items() if k in _SECURITY_KEYS)
        elif key in FLAGS and FLAGS[key] != "ignored" and key not in ("config-file", "version") or (
                key in options and key not in FLAGS):
            flat[key] = value
        else:
            reading.warnings.append(f"configuration file key not known, ignored as etcd ignores it key={key}")
    source = f"configuration file {path}"
    for key, value in flat.items():
        if value is None:
            continue  # JSON null: the default
        kind = FLAGS.get(key)
        if kind is None:  # one of shardetcd's own settings
            text = ("true" if value else "false") if key in switches and isinstance(value, bool) else str(value)
        else:
            try:
                text = _file_text(key, kind, value)
            except ValueError as exc:
                raise FlagError(f"{source}: {exc}", 1) from None
        _take(reading, key, text, options, switches, source)


# etcd flags handled here rather than by an option of the same name, or refused
_HANDLED = {"version", "unsafe-no-fsync", "config-file"}

MAX_ELECTION_MS = 50000  # etcd's bound on --election-timeout


def _bind_host_error(urls: list[str]) -> str | None:
    """etcd's check of URLs it listens on: an IP address (or localhost) to bind, not a name to resolve."""
    for u in urls:
        scheme, _, rest = u.partition("://")
        if scheme in ("unix", "unixs"):
            continue
        host = rest.rpartition(":")[0].removeprefix("[").removesuffix("]")
        if host == "localhost":
            continue
        try:
            ipaddress.ip_address(host)
        except ValueError:
            return f"expected IP in URL for binding ({u})"
        if "%" in host:  # Go's net.ParseIP takes no zone
            return f"expected IP in URL for binding ({u})"
    return None


def _empty_host(urls: list[str]) -> str | None:
    for u in urls:
        if u.partition("://")[2].rpartition(":")[0] == "":
            return f"unexpected empty host ({u})"
    return None


def validate(reading: Reading) -> str | None:
    """What etcd 3.5.1 says when it checks its settings once read ("failed to verify flags", exit 1),
    in its order and words; None when it would go on. Peer and Raft settings are checked although
    nothing here uses them: a manifest shardetcd takes must stay one etcd takes."""
    e = reading.etcd
    for flag, default in (("listen-peer-urls", ["http://localhost:2380"]),
                          ("listen-client-urls", ["http://localhost:2379"]), ("listen-metrics-urls", [])):
        if why := _bind_host_error(e.get(flag) or default):
            return why
    for flag, default in (("initial-advertise-peer-urls", ["http://localhost:2380"]),
                          ("advertise-client-urls", ["http://localhost:2379"])):
        urls = e.get(flag) or default
        if why := _empty_host(urls):
            return f'--{flag} {_go_quote(",".join(urls))} must be "host:port" ({why})'
    if sum(bool(e.get(f)) for f in ("discovery", "initial-cluster", "discovery-srv")) > 1:
        return ('multiple discovery or bootstrap flags are set. Choose one of "initial-cluster", "discovery" '
                'or "discovery-srv"')
    tick, election = e.get("heartbeat-interval", 100), e.get("election-timeout", 1000)
    if tick == 0:
        return "--heartbeat-interval must be >0 (set to 0ms)"
    if election == 0:
        return "--election-timeout must be >0 (set to 0ms)"
    if 5 * tick > election:
        return f"--election-timeout[{election}ms] should be at least as 5 times as --heartbeat-interval[{tick}ms]"
    if election > MAX_ELECTION_MS:
        return f"--election-timeout[{election}ms] is too long, and should be set less than {MAX_ELECTION_MS}ms"
    # from the command line or ETCD_*, etcd advertises no default once the listen URLs are given;
    # its configuration file keeps the default (here: the listen URLs)
    if reading.config_file is None and e.get("listen-client-urls") and not e.get("advertise-client-urls"):
        return "--advertise-client-urls is required when --listen-client-urls is set explicitly"
    return None


def _go_quote(text: str) -> str:
    """Go's %q of a string of printable ASCII (URLs): double quotes, backslash and quote escaped."""
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


def refusal(reading: Reading, journal_urls: tuple[str, ...]) -> str | None:
    """Why shardetcd must not start with these etcd flags (None: it may)."""
    e = reading.etcd
    if e.get("auto-tls"):
        return "--auto-tls: shardetcd generates no certificates; give --cert-file and --key-file"
    if e.get("host-whitelist") not in (None, [], ["*"]):
        return "--host-whitelist: shardetcd does not check the Host header of HTTP requests"
    if e.get("cors") not in (None, ["*"]):
        return "--cors: shardetcd answers HTTP requests from every origin (etcd's default, *)"
    if e.get("enable-grpc-gateway") is False:
        return "--enable-grpc-gateway=false: shardetcd always serves the gRPC gateway (JSON over HTTP)"
    if e.get("proxy", "off") != "off":
        return "--proxy: shardetcd is no etcd v2 proxy"
    if e.get("enable-v2") or e.get("experimental-enable-v2v3"):
        return "--enable-v2/--experimental-enable-v2v3: shardetcd serves the etcd v3 API only"
    if not journal_urls:
        members = _initial_cluster_names(str(e.get("initial-cluster", "")))
        if len(members) > 1 or any(e.get(f) for f in ("discovery", "discovery-srv", "discovery-srv-name")):
            return ("a cluster of several members (--initial-cluster names " + (", ".join(members) or "others")
                    + "; or discovery): with a local journal each process would be a database of its own. "
                    "Several processes serve one revision sequence only through a shared JetStream journal "
                    "(--journal-url, with --standby or --follow beside the writer); see the README")
    return None


def _initial_cluster_names(text: str) -> list[str]:
    names = []
    for entry in text.split(","):
        name = entry.partition("=")[0].strip()
        if name and name not in names:
            names.append(name)
    return names
