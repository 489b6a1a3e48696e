#!/usr/bin/env bash
# Installs what tests/deploy needs from Debian's packages when it is missing:
#   promtool, prometheus  <- package prometheus
#   alertmanager          <- package prometheus-alertmanager (binary: prometheus-alertmanager)
#   podman, runc          <- packages podman, runc (tests/deploy/test_image_podman.py builds and
#                            runs deploy/Dockerfile; runc because crun fails on some hosts' cgroups)
#   debootstrap           <- package debootstrap (the stand-in base image: no registry here)
#   python3.11d           <- packages python3.11-dbg, libpython3.11-dev (make sanitize's
#                            reference-leak run of the guard's C on a debug interpreter)
#   eu-stack              <- package elfutils (native stacks of engines that are not Python:
#                            llama.cpp's llama-server; capture/native.py)
# Idempotent (a no-op in well under a second when everything is there), quiet on success,
# bounded (every apt-get runs under `timeout`); the packages' services are not started.
# kubectl is checked, not installed: Debian has no package for it.
set -euo pipefail

have() { command -v "$1" >/dev/null 2>&1; }

need=()
{ have promtool && have prometheus; } || need+=(prometheus)
{ have alertmanager || have prometheus-alertmanager; } || need+=(prometheus-alertmanager)
have podman || need+=(podman)
have runc || need+=(runc)
have debootstrap || need+=(debootstrap)
{ have python3.11d && [ -e /usr/include/python3.11/Python.h ]; } || need+=(python3.11-dbg libpython3.11-dev)
have eu-stack || need+=(elfutils)

if ((${#need[@]})); then
    sudo=()
    if [ "$(id -u)" -ne 0 ]; then
        have sudo || { echo "ensure-tools: need root (or sudo) to apt-get install ${need[*]}" >&2; exit 1; }
        sudo=(sudo -n)
    fi
    log=$(mktemp)
    cleanup=("$log")
    # The packages ship services that would start listening on every interface: keep them
    # stopped (the tests start their own on loopback), unless the machine already has a policy.
    if [ ! -e /usr/sbin/policy-rc.d ] && [ ${#sudo[@]} -eq 0 ]; then
        printf '#!/bin/sh\nexit 101\n' >/usr/sbin/policy-rc.d
        chmod +x /usr/sbin/policy-rc.d
        cleanup+=(/usr/sbin/policy-rc.d)
    fi
    trap 'rm -f "${cleanup[@]}"' EXIT
    export DEBIAN_FRONTEND=noninteractive
    if ! { timeout 300 "${sudo[@]}" apt-get update -qq &&
        timeout 600 "${sudo[@]}" apt-get install -y -qq --no-install-recommends "${need[@]}"; } >"$log" 2>&1; then
        echo "ensure-tools: apt-get install ${need[*]} failed:" >&2
        tail -n 30 "$log" >&2
        exit 1
    fi
    for t in promtool prometheus; do
        have "$t" || { echo "ensure-tools: $t still missing after apt-get install" >&2; exit 1; }
    done
    have alertmanager || have prometheus-alertmanager ||
        { echo "ensure-tools: alertmanager still missing after apt-get install" >&2; exit 1; }
    for t in podman runc debootstrap python3.11d eu-stack; do
        have "$t" || { echo "ensure-tools: $t still missing after apt-get install" >&2; exit 1; }
    done
fi

have kubectl || { echo "ensure-tools: kubectl is missing (tests/deploy render the kustomize overlays with it)" >&2; exit 1; }
