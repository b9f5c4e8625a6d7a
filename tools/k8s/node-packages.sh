#!/usr/bin/env bash
# Installs the Debian packages the single-node cluster of the end-to-end tests runs on: containerd
# and runc (the container runtime), the CNI plugins (pod network), iptables and conntrack
# (kube-proxy), umoci (images) and gcc with static libc (the pause image). Skips what is present.
#
#   tools/k8s/node-packages.sh        # as root
set -euo pipefail
needed=()
command -v containerd >/dev/null || needed+=(containerd)
command -v runc >/dev/null || needed+=(runc)
[[ -x /usr/lib/cni/bridge ]] || needed+=(containernetworking-plugins)
command -v iptables >/dev/null || needed+=(iptables)
command -v conntrack >/dev/null || needed+=(conntrack)
command -v umoci >/dev/null || needed+=(umoci)
command -v gcc >/dev/null || needed+=(gcc)
[[ -f /usr/lib/x86_64-linux-gnu/libc.a || -f /usr/lib/aarch64-linux-gnu/libc.a ]] || needed+=(libc6-dev)
if [[ ${#needed[@]} -eq 0 ]]; then exit 0; fi
if [[ $(id -u) -ne 0 ]]; then
  echo "node packages missing (${needed[*]}); install them (apt-get install ${needed[*]}) or run this as root" >&2
  exit 1
fi
echo "node packages: installing ${needed[*]}" >&2
export DEBIAN_FRONTEND=noninteractive
apt-get install -y -q --no-install-recommends "${needed[@]}" >/dev/null 2>&1 \
  || { apt-get update -q >/dev/null && apt-get install -y -q --no-install-recommends "${needed[@]}" >/dev/null; }
