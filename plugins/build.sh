#!/usr/bin/env bash
# Builds every example plugin into a WebAssembly component of the wasmswitch:plugin world.
#
#   plugins/build.sh               # every example: each folder of examples/ with a Cargo.toml or *.c
#   plugins/build.sh acl c-portdeny  # just some
#   plugins/build.sh panicky       # a test plugin of testdata/ (never built by default)
#
# Output: plugins/out/<name>.wasm (override the folder with WASMSWITCH_PLUGIN_OUT). The last
# line printed is that folder.
#
# Rust examples (a Cargo.toml in examples/<name>): an installed rustup target
# wasm32-unknown-unknown when there is one; otherwise Debian's rustc-web + rust-web-src +
# lld-19 with -Zbuild-std (installed with apt-get when run as root). (The toolchain notes this project started from, outside this repository, verified it.)
#
# C examples (*.c in examples/<name>, no Cargo.toml): the bindings are generated from wit/ by
# `wit-bindgen c` (wit-bindgen-cli $wit_bindgen_version, installed once with `cargo install`
# into $WASMSWITCH_TOOL_CACHE, default ~/.cache/wasmswitch/tools, or taken from $WIT_BINDGEN)
# into target/c/<name>/, and everything is compiled with clang-19 --target=wasm32 -nostdlib
# (clang-19 and lld-19 installed with apt-get when run as root).
#
# The core module each example produces is wrapped into a component by tools/componentize
# (wit-component), which also checks it against wit/.
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
wit=$(cd "$here/../wit" && pwd)
out=${WASMSWITCH_PLUGIN_OUT:-$here/out}
target=wasm32-unknown-unknown
# Without arguments: every folder under examples/ that holds a Cargo.toml (Rust) or *.c (C).
all=()
for d in "$here"/examples/*/; do
    p=$(basename "$d")
    if [ -f "$d/Cargo.toml" ] || compgen -G "$d/*.c" >/dev/null; then all+=("$p"); fi
done
if [ $# -gt 0 ]; then plugins=("$@"); else plugins=("${all[@]}"); fi
# The wit-bindgen the C examples are generated with (pinned: the generated glue is part of the
# plugin, so a new version is a deliberate change).
wit_bindgen_version=0.63.0

log() { echo "build.sh: $*" >&2; }

rust=() c=()
for p in "${plugins[@]}"; do
    # testdata/: plugins the tests need (a panicking one), built only when named.
    dir=$here/examples/$p
    if [ ! -d "$dir" ] && [ -f "$here/testdata/$p/Cargo.toml" ]; then dir=$here/testdata/$p; fi
    if [ -f "$dir/Cargo.toml" ]; then
        # One cargo call builds them all by package name, and the core module is named after
        # the library: both follow from the folder name.
        if ! grep -qx "name = \"wasmswitch-plugin-$p\"" "$dir/Cargo.toml"; then
            log "${dir#"$here"/}/Cargo.toml: the package must be named wasmswitch-plugin-$p (see plugins/README.md)"
            exit 1
        fi
        rust+=("$p")
    elif compgen -G "$here/examples/$p/*.c" >/dev/null; then
        c+=("$p")
    else
        log "no example plugin $p in $here/examples (nor a test plugin in $here/testdata)"
        exit 1
    fi
done

# apt_need PKG...: installs the Debian packages not installed yet (as root), else fails with
# what to run.
apt_need() {
    local missing=() p
    for p in "$@"; do
        dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
    done
    [ ${#missing[@]} -eq 0 ] && return 0
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
        log "installing ${missing[*]}"
        apt-get update -q >&2
        DEBIAN_FRONTEND=noninteractive apt-get install -y -q "${missing[@]}" >&2
    else
        log "missing ${missing[*]}: as root, 'apt-get install ${missing[*]}'"
        return 1
    fi
}

mode=
if [ ${#rust[@]} -eq 0 ]; then
    :
elif command -v rustup >/dev/null 2>&1 && rustup target list --installed 2>/dev/null | grep -qx "$target"; then
    mode=rustup
else
    apt_need rustc-web rust-web-src lld-19 || {
        log "no wasm32 toolchain: run 'rustup target add $target', or as root 'apt-get install rustc-web rust-web-src lld-19'"
        exit 1
    }
    mode=debian
fi

wit_bindgen=
if [ ${#c[@]} -gt 0 ] && ! apt_need clang-19 lld-19; then
    # Building everything without root on a machine without clang-19: the Rust examples
    # still build; the C ones are skipped, said here (the host's tests then skip theirs).
    # Under CI=true, or when a C example was named, that is a failure.
    if [ $# -gt 0 ] || [ "${CI:-}" = true ]; then exit 1; fi
    log "skipping ${c[*]} (no clang-19/lld-19)"
    c=()
    plugins=("${rust[@]}")
fi
if [ ${#c[@]} -gt 0 ]; then
    if [ -n "${WIT_BINDGEN:-}" ]; then
        wit_bindgen=$WIT_BINDGEN
    else
        cache=${WASMSWITCH_TOOL_CACHE:-${XDG_CACHE_HOME:-${HOME:-$here/target}/.cache}/wasmswitch/tools}
        root="$cache/wit-bindgen-cli-$wit_bindgen_version"
        wit_bindgen="$root/bin/wit-bindgen"
        if [ ! -x "$wit_bindgen" ]; then
            # Only the C generator: 5-10 minutes on 2 busy cores, once per machine.
            log "installing wit-bindgen-cli $wit_bindgen_version into $root (once)"
            cargo install -q --locked --version "$wit_bindgen_version" --no-default-features --features c \
                --root "$root" wit-bindgen-cli >&2
        fi
    fi
fi

# The componentize tool is an ordinary native program.
log "building the componentize tool"
cargo build -q --release --manifest-path "$here/tools/componentize/Cargo.toml" --target-dir "$here/target/tool"
componentize="$here/target/tool/release/wasmswitch-componentize"

if [ ${#rust[@]} -gt 0 ]; then
    pkgs=()
    for p in "${rust[@]}"; do pkgs+=(-p "wasmswitch-plugin-$p"); done

    log "building ${rust[*]} for $target ($mode toolchain)"
    export CARGO_TARGET_DIR="$here/target/wasm"
    if [ "$mode" = rustup ]; then
        cargo build -q --release --target "$target" --manifest-path "$here/Cargo.toml" "${pkgs[@]}"
    else
        RUSTC=/usr/bin/rustc RUSTC_BOOTSTRAP=1 RUSTFLAGS="-C linker=/usr/lib/llvm-19/bin/wasm-ld" \
            cargo build -q --release --target "$target" --manifest-path "$here/Cargo.toml" \
            -Zbuild-std=std,panic_abort "${pkgs[@]}"
    fi
fi

declare -A core
for p in "${rust[@]}"; do core[$p]="$here/target/wasm/$target/release/${p//-/_}.wasm"; done
for p in "${c[@]}"; do
    # Bindings generated from wit/ at build time (never committed), then one clang link.
    gen="$here/target/c/$p"
    rm -rf "$gen" && mkdir -p "$gen"
    log "building $p with wit-bindgen c $("$wit_bindgen" --version | awk '{print $2}') and clang-19"
    if ! msg=$("$wit_bindgen" c "$wit" --world plugin --out-dir "$gen" 2>&1); then
        echo "$msg" >&2
        exit 1
    fi
    # No libc: an example brings the few functions the glue calls in examples/<name>/libc/.
    # -mbulk-memory: memcpy/memset become memory.copy/memory.fill instructions.
    clang-19 --target=$target -nostdlib -O2 -mbulk-memory -Wall -Wextra \
        -isystem "$here/examples/$p/libc" -I"$gen" -Wl,--no-entry -Wl,--strip-debug \
        -o "$gen/$p.core.wasm" "$here/examples/$p"/*.c "$here/examples/$p"/libc/*.c "$gen"/*.c "$gen"/*.o
    core[$p]="$gen/$p.core.wasm"
done

mkdir -p "$out"
for p in "${plugins[@]}"; do
    "$componentize" "$wit" "${core[$p]}" "$out/$p.wasm"
    log "$out/$p.wasm ($(wc -c <"$out/$p.wasm") bytes)"
done
echo "$out"
