"""Who is calling: certificates for agents, bearer tokens for clients.

A small cluster's credentials live in one folder, made by `drover certs
init` (`make_credentials`):

    ca.pem, ca.key           the cluster's CA (keep ca.key away from the nodes)
    server.pem, server.key   the control plane, for the names and addresses it serves on
    node-NAME.pem, .key      one per agent; the certificate's common name is the node
    tokens.json              sha256 of each client token -> its name and role
    NAME.token               a client's bearer token (only its holder needs it)

Agents authenticate with mutual TLS: their certificate, signed by the CA,
names the node they may speak for. Clients use TLS and a bearer token whose
role decides what they may do. The server keeps only tokens' hashes.
"""

from __future__ import annotations

import datetime
import hashlib
import ipaddress
import json
import re
import secrets
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from .validation import PermissionDenied, Unauthenticated

ROLES = ("reader", "operator", "admin")  # each may do what the one before it may, and more
DEFAULT_TOKENS = {"admin": "admin", "operator": "operator", "reader": "reader"}  # name -> role
VALID_DAYS = 365
NODE_NAME = re.compile(r"[A-Za-z0-9_.-]{1,64}")


@dataclass(frozen=True)
class Caller:
    """The authenticated peer of one RPC."""

    kind: str  # "agent" or "client"
    name: str  # the node, or the token's name
    role: str = ""  # a client's role

    def may(self, role: str) -> bool:
        return self.kind == "client" and ROLES.index(self.role) >= ROLES.index(role)


def token_digest(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def load_tokens(path: Path) -> dict[str, tuple[str, str]]:
    """sha256(token) -> (name, role) from tokens.json."""
    data = json.loads(path.read_text())
    return {digest: (entry["name"], entry["role"]) for digest, entry in data.items()}


def _key() -> ec.EllipticCurvePrivateKey:
    return ec.generate_private_key(ec.SECP256R1())


def _write_key(path: Path, key) -> None:
    path.write_bytes(
        key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    )
    path.chmod(0o600)


def _certificate(subject: str, key, issuer_cert, issuer_key, *, ca: bool = False, names=(), uris=(), usage=None):
    now = datetime.datetime.now(datetime.UTC)
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, subject)])
    builder = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(issuer_cert.subject if issuer_cert is not None else name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=VALID_DAYS))
        .add_extension(x509.BasicConstraints(ca=ca, path_length=0 if ca else None), critical=True)
    )
    if names or uris:
        alternatives = [x509.UniformResourceIdentifier(u) for u in uris]
        for n in names:
            try:
                alternatives.append(x509.IPAddress(ipaddress.ip_address(n)))
            except ValueError:
                alternatives.append(x509.DNSName(n))
        builder = builder.add_extension(x509.SubjectAlternativeName(alternatives), critical=False)
    if usage is not None:
        builder = builder.add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
    return builder.sign(issuer_key, hashes.SHA256())


def _write_cert(path: Path, cert) -> None:
    path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))


def _load_ca(folder: Path):
    cert = x509.load_pem_x509_certificate((folder / "ca.pem").read_bytes())
    key = serialization.load_pem_private_key((folder / "ca.key").read_bytes(), password=None)
    return cert, key


def make_ca(folder: Path, cluster: str = "drover") -> None:
    folder.mkdir(parents=True, exist_ok=True)
    key = _key()
    cert = _certificate(f"{cluster} CA", key, None, key, ca=True)
    _write_key(folder / "ca.key", key)
    _write_cert(folder / "ca.pem", cert)


def add_server(folder: Path, names: list[str]) -> None:
    """server.pem for these DNS names and IP addresses (clients check the one they dial)."""
    ca_cert, ca_key = _load_ca(folder)
    key = _key()
    cert = _certificate(names[0], key, ca_cert, ca_key, names=names, usage=ExtendedKeyUsageOID.SERVER_AUTH)
    _write_key(folder / "server.key", key)
    _write_cert(folder / "server.pem", cert)


def add_node(folder: Path, node: str) -> None:
    """node-NODE.pem: a client certificate whose common name is the node it speaks for."""
    if not NODE_NAME.fullmatch(node):
        raise ValueError(f"node name {node[:80]!r}: 1 to 64 letters, digits, '_', '.' or '-'")
    ca_cert, ca_key = _load_ca(folder)
    key = _key()
    # The node's name is the common name; the URI alternative name means no DNS name or address
    # is in the certificate, so it cannot pass for the control plane's even for a node named
    # like a host.
    cert = _certificate(
        node, key, ca_cert, ca_key, uris=[f"drover://node/{node}"], usage=ExtendedKeyUsageOID.CLIENT_AUTH
    )
    _write_key(folder / f"node-{node}.key", key)
    _write_cert(folder / f"node-{node}.pem", cert)


def add_token(folder: Path, name: str, role: str) -> str:
    """A new bearer token for a client: NAME.token, and its hash in tokens.json (replacing
    any earlier token of that name, which is how a token is rotated)."""
    if role not in ROLES:
        raise ValueError(f"role {role!r}: one of {', '.join(ROLES)}")
    if not NODE_NAME.fullmatch(name):  # it names a file in the folder: no '/' or '..' out of it
        raise ValueError(f"token name {name[:80]!r}: 1 to 64 letters, digits, '_', '.' or '-'")
    token = secrets.token_urlsafe(32)
    path = folder / "tokens.json"
    tokens = json.loads(path.read_text()) if path.exists() else {}
    tokens = {digest: entry for digest, entry in tokens.items() if entry["name"] != name}
    tokens[token_digest(token)] = {"name": name, "role": role}
    token_file = folder / f"{name}.token"  # written first: tokens.json never holds a token nobody has
    token_file.write_text(token + "\n")
    token_file.chmod(0o600)
    path.write_text(json.dumps(tokens, indent=1))
    return token


def make_credentials(folder: Path, nodes: list[str], server_names: list[str]) -> None:
    """A CA, the server's certificate, one per node, and an admin, operator and reader token."""
    make_ca(folder)
    add_server(folder, server_names)
    for node in nodes:
        add_node(folder, node)
    for name, role in DEFAULT_TOKENS.items():
        add_token(folder, name, role)


class Authenticator:
    """Tells who made a call: an agent by its certificate's common name, a client by its
    bearer token. Without tokens (`drover server --insecure`, loopback only) every caller is
    trusted as an admin and an agent may name any node."""

    def __init__(self, tokens: dict[str, tuple[str, str]] | None):
        self.tokens = tokens

    @property
    def secure(self) -> bool:
        return self.tokens is not None

    def agent(self, context) -> str | None:
        """The node the calling agent's certificate names; None when insecure (any node)."""
        if not self.secure:
            return None
        names = context.auth_context().get("x509_common_name")
        if not names:
            raise Unauthenticated("an agent must present its node certificate (mutual TLS on the agent port)")
        return names[0].decode()

    def client(self, context, role: str) -> Caller:
        """The calling client, if its token's role allows `role` (reader < operator < admin)."""
        if not self.secure:
            return Caller("client", "insecure", "admin")
        header = dict(context.invocation_metadata()).get("authorization", "")
        scheme, _, token = header.partition(" ")
        entry = self.tokens.get(token_digest(token)) if scheme.lower() == "bearer" and token else None
        if entry is None:
            raise Unauthenticated("a client must send a valid bearer token (authorization: Bearer TOKEN)")
        caller = Caller("client", *entry)
        if not caller.may(role):
            raise PermissionDenied(f"{caller.name} has role {caller.role}; this needs {role} or above")
        return caller
