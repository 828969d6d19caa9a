"""A real OpenSSH server on 127.0.0.1 for the ssh:// routes (`patchkit smoke --host ssh://...`,
`patchkit doctor host ssh://...`): Debian's openssh-server with its own config, host key, client key and
a free port, stopped by its pid on exit.

    with SshServer(workdir, env={"DOCKER_HOST": url}) as sshd:
        sshd.url        # "ssh://root@127.0.0.1:PORT"
        sshd.client_env # PATH with an `ssh` that uses this server's client config (key, known hosts)

The key's `environment=` option hands the session `env` (PermitUserEnvironment): DOCKER_HOST makes the
remote `docker system dial-stdio` (what the docker SDK runs over ssh) reach the test's engine. The `ssh`
on PATH is the system's own client with `-F` this server's config: OpenSSH reads ~/.ssh from the passwd
entry, not $HOME, so the user's own config is left untouched.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from pathlib import Path

from registry import free_port

SSHD = "/usr/sbin/sshd"


class SshServer:
    def __init__(self, workdir: Path, env: dict[str, str] | None = None):
        self.root = Path(workdir)
        self.env = env or {}
        self.port = free_port()
        self.proc: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"ssh://root@127.0.0.1:{self.port}"

    @property
    def client_env(self) -> dict[str, str]:
        return {"PATH": f"{self.root / 'bin'}:{os.environ['PATH']}"}

    def __enter__(self) -> SshServer:
        if not os.access(SSHD, os.X_OK) or shutil.which("ssh") is None:
            raise RuntimeError("sshd or ssh is missing: apt-get install openssh-server openssh-client")
        self.root.mkdir(parents=True, exist_ok=True)
        for name in ("host_key", "client_key"):
            subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(self.root / name)], check=True)
        environment = ",".join(f'environment="{k}={v}"' for k, v in self.env.items())
        (self.root / "authorized_keys").write_text(f"{environment} {(self.root / 'client_key.pub').read_text()}")
        (self.root / "sshd_config").write_text(
            f"Port {self.port}\nListenAddress 127.0.0.1\nHostKey {self.root / 'host_key'}\n"
            f"AuthorizedKeysFile {self.root / 'authorized_keys'}\nPidFile {self.root / 'sshd.pid'}\n"
            "PermitRootLogin prohibit-password\nPasswordAuthentication no\nKbdInteractiveAuthentication no\n"
            "PermitUserEnvironment yes\nUsePAM no\nStrictModes no\nLogLevel ERROR\n")
        (self.root / "ssh_config").write_text(
            f"Host *\n  IdentityFile {self.root / 'client_key'}\n  IdentitiesOnly yes\n"
            f"  UserKnownHostsFile {self.root / 'known_hosts'}\n  StrictHostKeyChecking accept-new\n  LogLevel ERROR\n")
        bin_dir = self.root / "bin"
        bin_dir.mkdir(exist_ok=True)
        wrapper = bin_dir / "ssh"
        wrapper.write_text(f"#!/bin/sh\nexec {shutil.which('ssh')} -F {self.root / 'ssh_config'} \"$@\"\n")
        wrapper.chmod(0o755)
        Path("/run/sshd").mkdir(exist_ok=True)  # sshd's privilege-separation directory
        self.log = open(self.root / "sshd.log", "wb")
        self.proc = subprocess.Popen([SSHD, "-D", "-e", "-f", str(self.root / "sshd_config")], stdout=self.log,
                                     stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"sshd exited {self.proc.returncode}: {(self.root / 'sshd.log').read_text()[-800:]}")
            probe = subprocess.run(["ssh", "-p", str(self.port), "-o", "BatchMode=yes", "root@127.0.0.1", "true"],
                                   env={**os.environ, **self.client_env}, capture_output=True)
            if probe.returncode == 0:
                return self
            time.sleep(0.3)
        self.__exit__()
        raise RuntimeError(f"sshd did not answer: {(self.root / 'sshd.log').read_text()[-800:]}")

    def __exit__(self, *exc) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        if getattr(self, "log", None) is not None:
            self.log.close()
