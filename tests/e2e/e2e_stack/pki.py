"""Who is who: Puppet identities (a certname and its files in an ssldir), the host's own as Puppet
itself reports it, and throwaway ones signed by a test's CA with openssl."""

from __future__ import annotations

import os
import pwd
import shutil
import subprocess
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from .proc import StackError, clean_env, run_checked


@dataclass
class Identity:
    """A Puppet certname and the ssldir with its key, its certificate, the CA bundle and the CRL,
    laid out as Puppet lays them out unless given (the host's settings may put them elsewhere)."""

    certname: str
    ssldir: Path
    hostcert: Path | None = None
    hostprivkey: Path | None = None
    localcacert: Path | None = None
    hostcrl: Path | None = None

    def __post_init__(self) -> None:
        self.ssldir = Path(self.ssldir)
        certs = self.ssldir / "certs"
        self.hostcert = Path(self.hostcert or certs / f"{self.certname}.pem")
        self.hostprivkey = Path(self.hostprivkey or self.ssldir / "private_keys" / f"{self.certname}.pem")
        self.localcacert = Path(self.localcacert or certs / "ca.pem")
        self.hostcrl = Path(self.hostcrl or self.ssldir / "crl.pem")


# --------------------------------------------------------------------------
# the host's Puppet settings (asked once from Puppet itself, as the truth to compare with)


@dataclass
class PuppetSettings:
    certname: str
    ssldir: str
    confdir: str
    hostcert: str
    hostprivkey: str
    localcacert: str
    config: str

    def identity(self) -> Identity:
        """The host's certname and its files, where Puppet says they are."""
        return Identity(
            self.certname,
            Path(self.ssldir),
            Path(self.hostcert),
            Path(self.hostprivkey),
            Path(self.localcacert),
        )


def puppet_settings() -> PuppetSettings:
    names = ["certname", "ssldir", "confdir", "hostcert", "hostprivkey", "localcacert", "config"]
    out = subprocess.run(
        ["puppet", "config", "print", *names, "--section", "server"],
        check=True,
        capture_output=True,
        text=True,
        timeout=120,
        env=clean_env(),
    ).stdout
    values = {}
    for line in out.splitlines():
        if " = " in line:
            k, v = line.split(" = ", 1)
            values[k.strip()] = v.strip()
    missing = [n for n in names if n not in values]
    if missing:
        raise StackError(f"`puppet config print` did not print {missing}: {out!r}")
    return PuppetSettings(**{n: values[n] for n in names})


# --------------------------------------------------------------------------
# a test's own CA

# The extensions Puppet's CA puts in the certificates it signs for agents and servers
# (compare `openssl x509 -text` of one it signed): no pp_cli_auth, which only the CA host gets.
SIGN_EXTENSIONS = """\
basicConstraints = critical, CA:FALSE
keyUsage = critical, digitalSignature, keyEncipherment
extendedKeyUsage = critical, serverAuth, clientAuth
subjectKeyIdentifier = hash
authorityKeyIdentifier = keyid
nsComment = "Puppet Server Internal Certificate"
subjectAltName = {sans}
"""


def ca_sign(cadir: Path, ca_ssldir: Path, ident: Identity, alt_names: Iterable[str] = ()) -> None:
    """A new 2048-bit key and a certificate for ``ident``, signed with openssl by the Puppet CA in
    ``cadir`` with the extensions Puppet's CA would give it; written to ``ident.ssldir`` with the
    CA bundle and CRL of ``ca_ssldir``, and recorded in the CA's serial, inventory and signed/
    as Puppet's CA records its own."""
    ssl_dir = ident.ssldir
    for d in (ssl_dir, ssl_dir / "certs", ssl_dir / "private_keys"):
        d.mkdir(parents=True, exist_ok=True)
        os.chmod(d, 0o750)
    key, cert = ident.hostprivkey, ident.hostcert
    run_checked(
        ["openssl", "genrsa", "-traditional", "-out", str(key), "2048"], f"a key for {ident.certname}"
    )
    os.chmod(key, 0o640)
    csr, ext = ssl_dir / f"{ident.certname}.csr", ssl_dir / f"{ident.certname}.ext"
    run_checked(
        ["openssl", "req", "-new", "-key", str(key), "-subj", f"/CN={ident.certname}", "-out", str(csr)],
        f"a CSR for {ident.certname}",
    )
    sans = ", ".join(f"DNS:{n}" for n in dict.fromkeys([ident.certname, *alt_names]))
    ext.write_text(SIGN_EXTENSIONS.format(sans=sans))
    serial_file = cadir / "serial"
    serial = int(serial_file.read_text().strip(), 16)
    run_checked(
        ["openssl", "x509", "-req", "-in", str(csr), "-CA", str(cadir / "ca_crt.pem"),
         "-CAkey", str(cadir / "ca_key.pem"), "-set_serial", str(serial), "-days", "30", "-sha256",
         "-extfile", str(ext), "-out", str(cert)],
        f"signing {ident.certname}",
    )  # fmt: skip
    csr.unlink()
    ext.unlink()
    serial_file.write_text(f"{serial + 1:04X}")  # the file keeps its owner (puppet)
    dates = run_checked(["openssl", "x509", "-in", str(cert), "-noout", "-startdate", "-enddate"], "dates")
    stamp = {
        k: time.strftime("%Y-%m-%dT%H:%M:%SUTC", time.strptime(v.strip(), "%b %d %H:%M:%S %Y %Z"))
        for k, v in (line.split("=", 1) for line in dates.splitlines())
    }
    with open(cadir / "inventory.txt", "a") as inv:
        inv.write(f"0x{serial:04x} {stamp['notBefore']} {stamp['notAfter']} /CN={ident.certname}\n")
    signed = cadir / "signed" / f"{ident.certname}.pem"
    shutil.copyfile(cert, signed)
    pw = pwd.getpwnam("puppet")
    os.chown(signed, pw.pw_uid, pw.pw_gid)
    os.chmod(cert, 0o644)
    shutil.copyfile(ca_ssldir / "certs" / "ca.pem", ident.localcacert)
    shutil.copyfile(ca_ssldir / "crl.pem", ident.hostcrl)
    os.chmod(ident.localcacert, 0o644)
    os.chmod(ident.hostcrl, 0o644)
