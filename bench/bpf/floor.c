// SPDX-License-Identifier: GPL-2.0
/* The benchmark's floor: attached at hooktrace's own probe sites (or at the
 * functions' first instructions), this program only counts its hits, so the
 * benchmark can tell what the uprobe traps cost from what hooktrace's
 * handler adds. It is the bench's own object, not part of hooktrace's: the
 * tracer never loads it. */
#include <linux/bpf.h>
#include <bpf/bpf_helpers.h>

char LICENSE[] SEC("license") = "GPL";

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, __u64);
} floor_hits SEC(".maps");

SEC("uprobe.multi")
int uprobe_floor(void *ctx)
{
	__u32 zero = 0;
	__u64 *v = bpf_map_lookup_elem(&floor_hits, &zero);
	if (v)
		(*v)++;
	return 0;
}
