#!/usr/bin/env bash
# What the test suite needs from the system, installed when missing (Debian's apt):
# chromium (the HTML report's browser test, driven by Playwright with executable_path: no
# browser download), a C compiler (the CPU-kind tests build bench/cpu/hide_avx512.c) and Java 17
# or newer (the Spark tests' local Spark runs on Debian's OpenJDK); DejaVu fonts (the OCR tests' pages);
# Prometheus' promtool and Pushgateway (the metrics tests).
set -euo pipefail
need=()
command -v chromium >/dev/null || command -v chromium-browser >/dev/null || need+=(chromium)
command -v cc >/dev/null || need+=(gcc libc6-dev)
java_major() { java -version 2>&1 | sed -n 's/.*version "\([0-9]*\).*/\1/p' | head -1; }
{ command -v java >/dev/null && [ "$(java_major)" -ge 17 ]; } || need+=(openjdk-17-jre-headless)
# the OCR tests draw their text pages with DejaVu Sans
[ -f /usr/share/fonts/truetype/dejavu/DejaVuSans.ttf ] || need+=(fonts-dejavu-core)
# a run's metrics: pushed to Debian's Pushgateway, the shipped alert rules tested by its promtool
command -v prometheus-pushgateway >/dev/null || need+=(prometheus-pushgateway)
command -v promtool >/dev/null || need+=(prometheus)
[ ${#need[@]} -eq 0 ] && exit 0
if ! command -v apt-get >/dev/null; then
    echo "tools/system_deps.sh: install ${need[*]} with your package manager (the test suite needs them)" >&2
    exit 1
fi
SUDO=""; [ "$(id -u)" = 0 ] || SUDO="sudo"
echo "installing ${need[*]} (apt-get)"
$SUDO apt-get update -qq
DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${need[@]}" >/dev/null
