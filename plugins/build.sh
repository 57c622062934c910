#!/usr/bin/env bash
# Builds every example plugin into a WebAssembly component of the wasmswitch:plugin world.
#
#   plugins/build.sh            # all examples
#   plugins/build.sh acl        # just some
#
# Output: plugins/out/<name>.wasm (override the folder with WASMSWITCH_PLUGIN_OUT). The last
# line printed is that folder.
#
# Toolchain: an installed rustup target wasm32-unknown-unknown when there is one; otherwise
# Debian's rustc-web + rust-web-src + lld-19 with -Zbuild-std (installed with apt-get when
# run as root). See shared/TOOLCHAIN.md. The core module each crate produces is wrapped into
# a component by tools/componentize (wit-component), which also checks it against wit/.
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
wit=$(cd "$here/../wit" && pwd)
out=${WASMSWITCH_PLUGIN_OUT:-$here/out}
target=wasm32-unknown-unknown
all=(acl ratelimit port-security sampler)
if [ $# -gt 0 ]; then plugins=("$@"); else plugins=("${all[@]}"); fi

log() { echo "build.sh: $*" >&2; }

mode=
if command -v rustup >/dev/null 2>&1 && rustup target list --installed 2>/dev/null | grep -qx "$target"; then
    mode=rustup
else
    missing=()
    for p in rustc-web rust-web-src lld-19; do
        dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
    done
    if [ ${#missing[@]} -gt 0 ]; then
        if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
            log "installing ${missing[*]} (no rustup wasm32 target here)"
            apt-get update -q >&2
            DEBIAN_FRONTEND=noninteractive apt-get install -y -q "${missing[@]}" >&2
        else
            log "no wasm32 toolchain: run 'rustup target add $target', or as root 'apt-get install rustc-web rust-web-src lld-19'"
            exit 1
        fi
    fi
    mode=debian
fi

# The componentize tool is an ordinary native program.
log "building the componentize tool"
cargo build -q --release --manifest-path "$here/tools/componentize/Cargo.toml" --target-dir "$here/target/tool"
componentize="$here/target/tool/release/wasmswitch-componentize"

pkgs=()
for p in "${plugins[@]}"; do pkgs+=(-p "wasmswitch-plugin-$p"); done

log "building ${plugins[*]} for $target ($mode toolchain)"
export CARGO_TARGET_DIR="$here/target/wasm"
if [ "$mode" = rustup ]; then
    cargo build -q --release --target "$target" --manifest-path "$here/Cargo.toml" "${pkgs[@]}"
else
    RUSTC=/usr/bin/rustc RUSTC_BOOTSTRAP=1 RUSTFLAGS="-C linker=/usr/lib/llvm-19/bin/wasm-ld" \
        cargo build -q --release --target "$target" --manifest-path "$here/Cargo.toml" \
        -Zbuild-std=std,panic_abort "${pkgs[@]}"
fi

mkdir -p "$out"
for p in "${plugins[@]}"; do
    core="$CARGO_TARGET_DIR/$target/release/${p//-/_}.wasm"
    "$componentize" "$wit" "$core" "$out/$p.wasm"
    log "$out/$p.wasm ($(wc -c <"$out/$p.wasm") bytes)"
done
echo "$out"
