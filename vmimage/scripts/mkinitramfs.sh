#!/bin/sh
# mkinitramfs.sh OUT KDIR KABI GUEST [CA]
#
# Builds OUT/initramfs.cpio.gz from:
#   KDIR   the extracted Debian kernel package (dpkg-deb -x)
#   KABI   its ABI name (e.g. 6.1.0-57-amd64)
#   GUEST  the static carbd-guest binary
#   CA     optional PEM file baked in as /etc/ssl/certs/carbd-ca.pem
# busybox comes from the busybox-static package, curl and its libraries
# from the curl package (found with ldd). Reproducible: sorted input,
# every mtime set to SOURCE_DATE_EPOCH, owner 0:0, cpio --reproducible,
# gzip -n.
set -eu
umask 022
OUT=$1 KDIR=$2 KABI=$3 GUEST=$4 CA=${5:-}
: "${SOURCE_DATE_EPOCH:?set SOURCE_DATE_EPOCH}"
HERE=$(cd "$(dirname "$0")" && pwd)
BUSYBOX=${BUSYBOX:-/bin/busybox}
CURL=${CURL:-/usr/bin/curl}
# MODULES: the kernel modules to load, in order (from the Makefile).
: "${MODULES:?set MODULES}"

die() { echo "mkinitramfs: $*" >&2; exit 1; }
[ -x "$BUSYBOX" ] || die "$BUSYBOX missing (apt-get install busybox-static)"
! ldd "$BUSYBOX" >/dev/null 2>&1 || die "$BUSYBOX is not static (install busybox-static)"
[ -x "$CURL" ] || die "$CURL missing (apt-get install curl)"
[ -x "$GUEST" ] || die "$GUEST missing"
MODDIR=$KDIR/lib/modules/$KABI
[ -d "$MODDIR" ] || die "$MODDIR missing"

ROOT=$OUT/root
rm -rf "$ROOT"
mkdir -p "$ROOT"
for d in bin sbin usr/bin usr/sbin etc/carbd etc/ssl/certs lib/modules proc sys dev run tmp root work; do
	mkdir -p "$ROOT/$d"
done

# busybox and its applets (symlinks, as busybox --install -s makes them).
cp "$BUSYBOX" "$ROOT/bin/busybox"
for a in $("$BUSYBOX" --list-full); do
	case "$a" in bin/busybox) continue ;; esac
	[ -e "$ROOT/$a" ] || ln -s /bin/busybox "$ROOT/$a"
done

# curl with the shared libraries it needs, at the paths ldd reports.
rm -f "$ROOT/usr/bin/curl"
cp "$CURL" "$ROOT/usr/bin/curl"
ldd "$CURL" | awk '/=>/ { print $3 } /^[[:space:]]*\// { print $1 }' | sort -u | while read -r lib; do
	[ -f "$lib" ] || die "ldd: $lib not found"
	mkdir -p "$ROOT$(dirname "$lib")"
	cp -L "$lib" "$ROOT$lib"
done

# The kernel modules, flat, in load order; each one's dependencies must
# come earlier in the list (checked from modinfo's depends field).
: >"$ROOT/etc/carbd/modules"
loaded=" "
for m in $MODULES; do
	f=$(find "$MODDIR" -name "$m.ko" -o -name "$m.ko.xz" | head -n 1)
	if [ -z "$f" ]; then
		grep -q "/$m.ko\$" "$MODDIR/modules.builtin" || die "module $m not in $KABI"
		loaded="$loaded$m "
		continue
	fi
	case "$f" in *.xz) xz -dc "$f" >"$ROOT/lib/modules/$m.ko" ;; *) cp "$f" "$ROOT/lib/modules/$m.ko" ;; esac
	deps=$(modinfo -F depends "$ROOT/lib/modules/$m.ko" | tr ',' ' ')
	for d in $deps; do
		case "$loaded" in *" $d "*) ;; *) die "module $m needs $d, which is not loaded before it" ;; esac
	done
	loaded="$loaded$m "
	echo "$m" >>"$ROOT/etc/carbd/modules"
done

cp "$HERE/init" "$ROOT/init"
chmod 0755 "$ROOT/init"
cp "$GUEST" "$ROOT/sbin/carbd-guest"
chmod 0755 "$ROOT/sbin/carbd-guest"

printf 'root:x:0:0:root:/root:/bin/sh\n' >"$ROOT/etc/passwd"
printf 'root:x:0:\n' >"$ROOT/etc/group"
printf '127.0.0.1 localhost\n::1 localhost\n' >"$ROOT/etc/hosts"
: >"$ROOT/etc/resolv.conf"
: >"$ROOT/etc/ssl/certs/ca-certificates.crt"
if [ -n "$CA" ]; then
	grep -q 'BEGIN CERTIFICATE' "$CA" || die "CA $CA is not a PEM certificate"
	cp "$CA" "$ROOT/etc/ssl/certs/carbd-ca.pem"
fi

# Normalize and pack.
find "$ROOT" ! -type l -exec chmod go-w {} +
chmod 1777 "$ROOT/tmp"
find "$ROOT" -exec touch -h -d "@$SOURCE_DATE_EPOCH" {} +
(cd "$ROOT" && find . -mindepth 1 | LC_ALL=C sort | cpio --quiet -o -H newc -R 0:0 --reproducible) | gzip -n -9 >"$OUT/initramfs.cpio.gz.tmp"
mv "$OUT/initramfs.cpio.gz.tmp" "$OUT/initramfs.cpio.gz"
