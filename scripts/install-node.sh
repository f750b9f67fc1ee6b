#!/usr/bin/env bash
# Installs what the local cluster's real node needs beside the kubelet (built from cluster/ with the
# control plane): containerd, runc, the CNI plugins (bridge, host-local, loopback), busybox-static (the
# test image's shell), iptables (the `kubernetes` Service address for hostNetwork pods) and a static C
# library for the pause image. All from Debian with apt-get. Idempotent: when everything is present it
# says so and returns at once.
#
#   usage: bash scripts/install-node.sh
#
# Never fails the build: where it cannot install (not root, no apt-get, apt-get failing) it prints one
# line saying why and exits 0; devtools/realnode.py then finds what is missing and the real-node tests
# skip with that reason.
set -uo pipefail

missing=()
command -v containerd >/dev/null || missing+=(containerd)
command -v runc >/dev/null || missing+=(runc)
[[ -x /usr/lib/cni/bridge && -x /usr/lib/cni/host-local && -x /usr/lib/cni/loopback ]] \
    || missing+=(containernetworking-plugins)
[[ -x /bin/busybox ]] && /bin/busybox --list >/dev/null 2>&1 || missing+=(busybox-static)
command -v iptables >/dev/null || missing+=(iptables)
command -v gcc >/dev/null || missing+=(gcc)
[[ -f /usr/lib/x86_64-linux-gnu/libc.a || -f /usr/lib/aarch64-linux-gnu/libc.a || -f /usr/lib/libc.a ]] \
    || missing+=(libc6-dev)

if [[ ${#missing[@]} -eq 0 ]]; then
    echo "install-node: containerd, runc, CNI plugins, busybox-static, iptables and gcc present"
    exit 0
fi
if [[ "$(uname -s)" != Linux ]]; then
    echo "install-node: not Linux ($(uname -s)): no real node here (needs ${missing[*]}); real-node tests will skip"
    exit 0
fi
if [[ $(id -u) -ne 0 ]]; then
    echo "install-node: not root: cannot install ${missing[*]} (and a kubelet needs root); real-node tests will skip"
    exit 0
fi
if ! command -v apt-get >/dev/null; then
    echo "install-node: no apt-get: install ${missing[*]} yourself; real-node tests will skip until then"
    exit 0
fi
echo "install-node: apt-get install ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
log=$(mktemp)
if ! { apt-get install -y -q --no-install-recommends "${missing[@]}" >"$log" 2>&1 \
        || { apt-get update -q >>"$log" 2>&1 \
             && apt-get install -y -q --no-install-recommends "${missing[@]}" >>"$log" 2>&1; }; }; then
    echo "install-node: apt-get install ${missing[*]} failed ($(tail -n1 "$log")); real-node tests will skip"
    rm -f "$log"
    exit 0
fi
rm -f "$log"
# Debian's package enables and starts containerd.service where systemd runs; the real node runs its own
# containerd (own socket, root and state folders), so the system one is left as the package set it up.
echo "install-node: installed ${missing[*]}"
