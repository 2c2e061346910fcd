#!/bin/bash
# vm-run.sh KERNEL_IMAGE CMD [ARGS...]  (make test-kernels runs it)
#
# Boot KERNEL_IMAGE (a bzImage, e.g. /boot/vmlinuz-6.1.0-57-amd64) in QEMU with
# the host's root filesystem shared read-only over virtio-9p (virtme-ng style),
# run CMD [ARGS...] inside as root, print its output, and exit with CMD's exit
# status.  Exit 125 when the VM itself failed (no status came back).
#
# Inside the guest:
#   /            overlayfs: host / (9p, read-only) + tmpfs upper, so writes work
#                but are thrown away (falls back to a plain read-only root
#                with tmpfs on /tmp and /var/tmp if overlayfs can't be mounted)
#   /proc /sys /dev /dev/pts /dev/shm /run, bpffs on /sys/fs/bpf, debugfs,
#   tracefs, cgroup2: fresh guest mounts
#   cwd          the host's current directory (falls back to /)
#   stdin        /dev/null; stdout and stderr both arrive on the host's stdout
#   $VM_OUT      (= /run/vmrun/out) a directory shared read-write with the host;
#                with VM_OUTDIR=DIR set on the host it is DIR, else a temp dir
#                that is deleted afterwards
#
# The guest kernel needs 9p/virtio either built in or as modules under
# /lib/modules/<version>/ on the host (the version is read from the image; set
# VM_KVER to override).  A tiny busybox initramfs that loads them is built once
# per kernel and cached in $VM_CACHE (default /var/cache/hooktrace/vm).
#
# Environment knobs:
#   VM_ACCEL    kvm | tcg (default: kvm if /dev/kvm is usable and the CPU has
#               vmx/svm, else tcg)
#   VM_SMP      vCPUs (default 2)      VM_MEM     memory (default 2G)
#   VM_TIMEOUT  seconds before the VM is killed (default 900)
#   VM_APPEND   extra kernel command line
#   VM_VERBOSE  1: also print the whole serial console (boot log) to stderr
#   VM_CPU      QEMU -cpu model (default: max,-la57 for tcg, host for kvm;
#               TCG's "max" would give the guest 5-level paging, unlike most hosts)
#   VM_TTY      1: the command's stdout/stderr is the serial console (a tty);
#               default: a pipe
#   VM_MODDIR   root under which lib/modules/<version>/ holds the kernel's
#               modules (default /), e.g. a directory made with dpkg-deb -x
#               and depmod -b DIR VERSION
#
# Needs: qemu-system-x86, busybox-static, kmod (modprobe), cpio, gzip.
set -euo pipefail

usage() { echo "usage: $0 KERNEL_IMAGE CMD [ARGS...]" >&2; exit 2; }
[ $# -ge 2 ] || usage
KIMG=$(readlink -f -- "$1"); shift
[ -r "$KIMG" ] || { echo "vm-run: cannot read kernel image $KIMG" >&2; exit 2; }

die() { echo "vm-run: $*" >&2; exit 125; }
for t in qemu-system-x86_64 modprobe cpio gzip; do
	command -v "$t" >/dev/null || die "$t not found"
done
BUSYBOX=${VM_BUSYBOX:-/bin/busybox}
file -L "$BUSYBOX" 2>/dev/null | grep -q 'statically linked' ||
	die "$BUSYBOX is not a static busybox (apt-get install busybox-static)"

# Kernel version: from the bzImage header ("version 6.1.0-57-amd64 (...)").
KVER=${VM_KVER:-$(file -bL "$KIMG" | sed -n 's/.*, version \([^ ]*\) .*/\1/p')}
[ -n "$KVER" ] || KVER=$(basename "$KIMG" | sed -n 's/^vmlinuz-//p')
[ -n "$KVER" ] || die "cannot tell the kernel version of $KIMG; set VM_KVER"

CACHE=${VM_CACHE:-/var/cache/hooktrace/vm}
mkdir -p "$CACHE"
MODROOT=$(readlink -f "${VM_MODDIR:-/}")
INITRD=$CACHE/initramfs-$KVER.cpio.gz

build_initramfs() {
	local d m line path name
	d=$(mktemp -d)
	mkdir -p "$d"/bin "$d"/mods "$d"/proc "$d"/sys "$d"/dev "$d"/newroot
	cp "$BUSYBOX" "$d"/bin/busybox
	: >"$d"/mods/order
	if [ -d "$MODROOT/lib/modules/$KVER" ]; then
		for m in virtio_pci 9pnet_virtio 9p overlay; do
			modprobe -d "$MODROOT" -S "$KVER" --show-depends "$m" 2>/dev/null | while read -r line; do
				set -- $line
				[ "$1" = insmod ] || continue        # "builtin X": nothing to load
				path=$2; name=$(basename "$path")
				name=${name%.xz}; name=${name%.zst}; name=${name%.gz}
				grep -qxF "$name" "$d"/mods/order && continue
				case $path in
				*.xz) xz -dc "$path" >"$d/mods/$name" ;;
				*.zst) zstd -qdc "$path" >"$d/mods/$name" ;;
				*.gz) gzip -dc "$path" >"$d/mods/$name" ;;
				*) cp "$path" "$d/mods/$name" ;;
				esac
				echo "$name" >>"$d"/mods/order
			done
		done
	else
		echo "vm-run: no $MODROOT/lib/modules/$KVER: assuming 9p and virtio are built in" >&2
	fi
	cat >"$d"/init <<'EOF'
#!/bin/busybox sh
/bin/busybox --install -s /bin
export PATH=/bin
mount -t proc proc /proc
mount -t sysfs sysfs /sys
mount -t devtmpfs devtmpfs /dev
halt_now() { echo "vm-init: $*"; echo o >/proc/sysrq-trigger; sleep 5; exit 1; }
while read -r m; do
	insmod "/mods/$m" || echo "vm-init: insmod $m failed"
done </mods/order
R=/newroot
mkdir -p /lower /upper
mount -t 9p -o ro,trans=virtio,version=9p2000.L,cache=loose,msize=262144 /dev/root /lower ||
	halt_now "cannot mount the host root over 9p"
mount -t tmpfs -o mode=755 tmpfs /upper
mkdir -p /upper/u /upper/w
if mount -t overlay -o lowerdir=/lower,upperdir=/upper/u,workdir=/upper/w overlay $R 2>/dev/null; then
	:
else
	echo "vm-init: overlayfs failed; read-only root with tmpfs /tmp /var/tmp"
	mount --move /lower $R
	mount -t tmpfs -o mode=1777 tmpfs $R/tmp
	mount -t tmpfs -o mode=1777 tmpfs $R/var/tmp
fi
mount -t tmpfs -o mode=755 tmpfs $R/run
mkdir -p $R/run/vmrun
mount -t 9p -o trans=virtio,version=9p2000.L,msize=262144 vmrun $R/run/vmrun ||
	halt_now "cannot mount the run directory"
mount --move /proc $R/proc
mount --move /sys $R/sys
mount --move /dev $R/dev
exec switch_root $R /bin/sh /run/vmrun/stage2.sh
EOF
	chmod 755 "$d"/init
	(cd "$d" && find . | cpio -o -H newc --quiet | gzip -1) >"$INITRD.tmp"
	mv "$INITRD.tmp" "$INITRD"
	rm -rf "$d"
}
if [ ! -s "$INITRD" ] || [ "$INITRD" -ot "$KIMG" ] || [ "$INITRD" -ot "$0" ]; then
	build_initramfs
fi

# Per-run directory shared read-write with the guest (tag vmrun).
RUNDIR=$(mktemp -d /tmp/vm-run.XXXXXX)
cleanup() { rm -rf "$RUNDIR"; }
trap cleanup EXIT
if [ -n "${VM_OUTDIR:-}" ]; then
	mkdir -p "$VM_OUTDIR"
	ln -s "$(readlink -f "$VM_OUTDIR")" "$RUNDIR/out.host" # for the user only
	OUTSHARE=$(readlink -f "$VM_OUTDIR")
else
	mkdir "$RUNDIR/out"
	OUTSHARE=$RUNDIR/out
fi

# The command, quoted for sh.
{
	printf 'exec'
	printf ' %q' "$@"
	printf '\n'
} >"$RUNDIR/cmd.sh"
# %q is bash syntax; run cmd.sh with bash when it is there.
printf '%s\n' "$(pwd -P)" >"$RUNDIR/cwd"
echo "${VM_TTY:-0}" >"$RUNDIR/tty"

cat >"$RUNDIR/stage2.sh" <<'EOF'
# PID 1 in the guest, on the host's root filesystem.
export PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
export HOME=/root TERM=dumb LANG=C.UTF-8 VM_OUT=/run/vmrun/out
mkdir -p /dev/pts /dev/shm /sys/fs/bpf /run/vmrun/out
mount -t devpts -o gid=5,mode=620,ptmxmode=666 devpts /dev/pts
mount -t tmpfs -o mode=1777 tmpfs /dev/shm
mount -t bpf bpf /sys/fs/bpf
mount -t debugfs debugfs /sys/kernel/debug 2>/dev/null
mount -t tracefs tracefs /sys/kernel/tracing 2>/dev/null
mount -t cgroup2 cgroup2 /sys/fs/cgroup 2>/dev/null
mount -t 9p -o trans=virtio,version=9p2000.L,msize=262144 vmout /run/vmrun/out
ln -sf /proc/self/fd /dev/fd 2>/dev/null
hostname vm 2>/dev/null
ip link set lo up 2>/dev/null
cd "$(cat /run/vmrun/cwd)" 2>/dev/null || cd /
echo "<<<VMRUN-BEGIN>>>"
SH=/bin/sh; [ -x /bin/bash ] && SH=/bin/bash
if [ "$(cat /run/vmrun/tty)" = 1 ]; then
	$SH /run/vmrun/cmd.sh </dev/null 2>&1; echo $? >/run/rc
else	# through a pipe, so that stdout and stderr are not a terminal
	{ $SH /run/vmrun/cmd.sh </dev/null 2>&1; echo $? >/run/rc; } | cat
fi
rc=$(cat /run/rc)
echo "<<<VMRUN-END rc=$rc>>>"
echo "$rc" >/run/vmrun/rc
sync
echo o >/proc/sysrq-trigger
sleep 10
EOF

# Accelerator.
if [ -z "${VM_ACCEL:-}" ]; then
	if [ -w /dev/kvm ] && grep -qE '\b(vmx|svm)\b' /proc/cpuinfo; then VM_ACCEL=kvm; else VM_ACCEL=tcg; fi
fi
case $VM_ACCEL in
kvm) ACCEL=(-accel kvm -cpu "${VM_CPU:-host}") ;;
tcg) ACCEL=(-accel tcg,thread=multi -cpu "${VM_CPU:-max,-la57}") ;;
*) die "VM_ACCEL must be kvm or tcg" ;;
esac

APPEND="console=ttyS0 quiet panic=-1 rdinit=/init ${VM_APPEND:-}"
QEMU=(qemu-system-x86_64 -nodefaults -no-user-config -display none -no-reboot
	-machine pc "${ACCEL[@]}" -smp "${VM_SMP:-2}" -m "${VM_MEM:-2G}"
	-kernel "$KIMG" -initrd "$INITRD" -append "$APPEND"
	-serial stdio -monitor none
	-fsdev local,id=root,path=/,security_model=none,readonly=on,multidevs=remap
	-device virtio-9p-pci,fsdev=root,mount_tag=/dev/root
	-fsdev local,id=run,path="$RUNDIR",security_model=none,multidevs=remap
	-device virtio-9p-pci,fsdev=run,mount_tag=vmrun
	-fsdev local,id=out,path="$OUTSHARE",security_model=none,multidevs=remap
	-device virtio-9p-pci,fsdev=out,mount_tag=vmout)

LOG=$RUNDIR/console.log
set +e
# Stream the command's output (between the markers) as it comes; keep the
# whole console in $LOG for when something goes wrong.
timeout --foreground -k 10 "${VM_TIMEOUT:-900}" "${QEMU[@]}" </dev/null 2>"$RUNDIR/qemu.err" |
	tee "$LOG" |
	awk -v verbose="${VM_VERBOSE:-0}" '
		{ sub(/\r$/, "") }
		verbose == "1" { print > "/dev/stderr" }
		/^<<<VMRUN-END rc=[0-9]+>>>$/ { on = 0; next }
		on { print; fflush() }
		/<<<VMRUN-BEGIN>>>$/ { on = 1 }'
st=("${PIPESTATUS[@]}")
set -e
if [ -s "$RUNDIR/rc" ]; then
	rc=$(cat "$RUNDIR/rc")
	echo "vm-run: exit status $rc (kernel $KVER, $VM_ACCEL)" >&2
	exit "$rc"
fi
echo "vm-run: the VM did not report an exit status (qemu/timeout status ${st[0]}); last console lines:" >&2
tr -d '\r' <"$LOG" | tail -n 40 >&2
cat "$RUNDIR/qemu.err" >&2
exit 125
