#!/usr/bin/env bash
# Runs a command as on a fresh machine without the test suite's parts (tests/parts.py): SLURM and munge,
# nftables, openssh-server, environment-modules, podman and runc, Chromium, and the XLA venv.
#
#   bash tests/without_parts.sh COMMAND [ARG...]      (as root: it makes a mount namespace)
#
# The command runs in a private mount namespace (unshare) where every program of those packages is covered by
# /dev/null (no file, not executable: as if not installed), and the module system's folder, the XLA venvs'
# folder and the test cluster's own folders (/run/launchsl, /tmp/launch-test-cluster) by empty ones. Nothing it
# does reaches the real parts, or a test cluster that runs; nothing outside the namespace changes, and the
# namespace ends with the command. openssh-client and iproute2 stay: a fresh machine of this kind has them.
set -euo pipefail
[ $# -gt 0 ] || { echo "usage: $0 COMMAND [ARG...]" >&2; exit 2; }
if [ "${LAUNCH_PARTS_HIDDEN:-}" != 1 ]; then
    [ "$(id -u)" = 0 ] || { echo "$0: needs root (it makes a mount namespace)" >&2; exit 2; }
    exec unshare --mount --propagation private env LAUNCH_PARTS_HIDDEN=1 bash "$0" "$@"
fi

PACKAGES=(slurmctld slurmd slurm-client munge nftables openssh-server environment-modules podman runc chromium)
covered=0
while read -r path; do
    case $path in */bin/*|*/sbin/*) ;; *) continue ;; esac
    if [ -f "$path" ] && [ ! -L "$path" ]; then
        mount --bind /dev/null "$path"
        covered=$((covered + 1))
    fi
done < <(for package in "${PACKAGES[@]}"; do dpkg-query -L "$package" 2>/dev/null || true; done)

unset LAUNCH_XLA_VENV
for folder in /usr/share/modules "${XDG_CACHE_HOME:-$HOME/.cache}/launch" /run/launchsl /tmp/launch-test-cluster; do
    if [ -d "$folder" ]; then
        mount -t tmpfs -o size=16m,mode=0755 launch-without-parts "$folder"
    fi
done
echo "without_parts: $covered programs of ${PACKAGES[*]} covered; the XLA venvs and the test cluster's folders hidden" >&2
exec "$@"
