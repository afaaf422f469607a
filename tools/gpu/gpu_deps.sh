#!/usr/bin/env bash
# Gathers what remat's build needs on a lent GPU machine that has the CUDA toolkit, CMake,
# ninja and a C++ compiler but no Debian packages and no network (docs/performance.md,
# "GPU checks"). Run it HERE, on a Debian 12 machine that reaches Debian's archive:
#
#   tools/gpu/gpu_deps.sh            # third_party/gpu-deps/root, about 42 MB
#
# It fetches the -dev packages of tools/bootstrap.sh that the build uses, and their
# shared libraries, with `apt-get download` into third_party/gpu-deps/debs/, unpacks them
# with `dpkg -x` into third_party/gpu-deps/root/ (CMake's REMAT_DEPS_PREFIX), and drops
# what the build does not use (documentation, static OpenBLAS, LAPACK, the reference
# BLAS). third_party/gpu-deps/ is ignored by git: name third_party/gpu-deps/root in the
# device tool's `carry` list; tools/gpu/gpu_check.sh finds it there.
#
# Not gathered: boost.context (only the CUDA emulator needs it, and its headers are
# 140 MB; gpu_check.sh builds with REMAT_EMU=OFF), libgomp (the compiler's own OpenMP
# runtime is used), the C library and libstdc++ (the machine's; see MANIFEST.txt for
# the newest symbol versions the gathered libraries need).
set -euo pipefail
cd "$(dirname "$0")/../.."

out=third_party/gpu-deps
debs=$out/debs
root=$out/root

# Debian 12 names. The -dev packages CMakeLists.txt finds, then the shared libraries they
# link to (and OpenBLAS's Fortran runtime).
DEV_PACKAGES=(
  libspdlog-dev libfmt-dev nlohmann-json3-dev libcli11-dev
  libgtest-dev libgmock-dev zlib1g-dev libopenblas-openmp-dev
)
RUNTIME_PACKAGES=(libspdlog1.10 libfmt9 zlib1g libopenblas0-openmp libgfortran5 libquadmath0)

apt_opts=()
if [[ $(id -u) -eq 0 ]]; then apt_opts+=(-o APT::Sandbox::User=root); fi  # no "unsandboxed" warning

rm -rf "$debs" "$root"
mkdir -p "$debs" "$root"
echo "gpu_deps: downloading ${#DEV_PACKAGES[@]} -dev and ${#RUNTIME_PACKAGES[@]} runtime packages"
if ! (cd "$debs" && apt-get "${apt_opts[@]}" download -q "${DEV_PACKAGES[@]}" "${RUNTIME_PACKAGES[@]}" >/dev/null); then
  echo "gpu_deps: download failed; refreshing the package lists (apt-get update) and trying again"
  SUDO=""
  if [[ $(id -u) -ne 0 ]]; then SUDO="sudo"; fi
  $SUDO apt-get update -qq
  (cd "$debs" && apt-get "${apt_opts[@]}" download -q "${DEV_PACKAGES[@]}" "${RUNTIME_PACKAGES[@]}" >/dev/null)
fi

for f in "$debs"/*.deb; do dpkg -x "$f" "$root"; done

# Not used by the build.
rm -rf "$root/usr/share/doc" "$root/usr/share/lintian" "$root/usr/share/man"
find "$root" -name '*.a' ! -name 'libgtest*.a' ! -name 'libgmock*.a' -delete
find "$root/usr/lib" \( -name 'liblapack.so*' -o -name 'libblas.so*' \) -delete
# Absolute links (libz.so -> /lib/x86_64-linux-gnu/libz.so.1.2.13) would leave the
# folder: point them at the same file inside it.
while IFS= read -r link; do
  target=$(readlink "$link")
  if [[ -e "$root$target" ]]; then
    ln -sfnr "$root$target" "$link"
  else
    echo "gpu_deps: dropping $link (its target $target is not in the packages)"
    rm -f "$link"
  fi
done < <(find "$root" -type l -lname '/*')
find "$root" -xtype l -delete  # links to files dropped above
find "$root" -type d -empty -delete

# The newest C library and libstdc++ symbol versions the gathered libraries ask for: the
# GPU machine must have at least these.
newest() { find "$root" -name '*.so*' -type f -exec objdump -T {} + 2>/dev/null | grep -o "$1[0-9.]*" | sort -uV | tail -1; }
glibc=$(newest 'GLIBC_')
glibcxx=$(newest 'GLIBCXX_')
size=$(du -sb "$root" | cut -f1)
{
  echo "# Debian packages unpacked by tools/gpu/gpu_deps.sh (dpkg -x), trimmed"
  # shellcheck disable=SC2016  # dpkg-deb's own ${Field} syntax
  for f in "$debs"/*.deb; do dpkg-deb --showformat='${Package} ${Version}\n' -W "$f"; done
  echo "needs: ${glibc:-GLIBC_?} ${glibcxx:-GLIBCXX_?} (C library and libstdc++ symbol versions, at least)"
  echo "built on: $(grep -h '^PRETTY_NAME=' /etc/os-release | cut -d'"' -f2), $(ldd --version | head -1)"
  echo "size: $size bytes"
} >"$root/MANIFEST.txt"

echo "gpu_deps: $root: $(du -sh "$root" | cut -f1) ($size bytes; the .debs: $(du -sh "$debs" | cut -f1))"
echo "gpu_deps: the libraries need at least ${glibc:-?} and ${glibcxx:-?} on the GPU machine"
echo "gpu_deps: device tool: carry [\"$root\"], command: tools/gpu/gpu_check.sh"
