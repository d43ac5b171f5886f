# Sourced by the scripts: makes sure a Rust toolchain (>= 1.85) and a C
# compiler are present, installing Debian's packages if they are not.
ensure_toolchain() {
  if ! command -v cargo >/dev/null 2>&1 && [ -x "$HOME/.cargo/bin/cargo" ]; then
    export PATH="$HOME/.cargo/bin:$PATH"
  fi
  if ! command -v cargo >/dev/null 2>&1 || ! command -v cc >/dev/null 2>&1; then
    echo "== installing the Rust toolchain and a C compiler from Debian (cargo-web, rustc-web, gcc)"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq cargo-web rustc-web gcc g++ >/dev/null
  fi
}

# Installs Debian packages that are missing (by command name:package pairs).
ensure_packages() {
  local missing=()
  for pair in "$@"; do
    command -v "${pair%%:*}" >/dev/null 2>&1 || missing+=("${pair#*:}")
  done
  if [ ${#missing[@]} -gt 0 ]; then
    echo "== installing ${missing[*]}"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq "${missing[@]}" >/dev/null
  fi
}
