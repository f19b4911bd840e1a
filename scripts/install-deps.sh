#!/usr/bin/env bash
# Installs the Debian 12 packages mla builds with. Run as root (or with sudo available).
set -euo pipefail
SUDO=""
[ "$(id -u)" -eq 0 ] || SUDO="sudo"
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends \
  g++ make cmake pkg-config clang libclang-rt-14-dev \
  libdnnl-dev nlohmann-json3-dev libpcre2-dev libicu-dev libcli11-dev libcpp-httplib-dev \
  libgtest-dev libgmock-dev libbenchmark-dev zlib1g-dev \
  libopenmpi-dev openmpi-bin \
  python3-numpy >/dev/null
# Node.js and npm run the end-to-end tests with the official openai client (tests/e2e).
command -v npm >/dev/null || $SUDO apt-get install -y -qq --no-install-recommends nodejs npm >/dev/null
# Chromium runs the chat page's browser test (tests/e2e/webui.mjs, through puppeteer-core).
command -v chromium >/dev/null || $SUDO apt-get install -y -qq --no-install-recommends chromium >/dev/null
