/* The ring's record layout and the contract's enums (bpf/hooktrace.h),
 * which the BPF programs and the preloaded library both follow, brought
 * into Go for the tracer and the converter by bpf2go -type. There is no
 * program here: the object bpf2go builds from this file only carries the
 * types' BTF. */
#include <linux/types.h>
#include "../../../bpf/hooktrace.h"
#include "../../../bpf/glibc.h"

const struct event *unused_event __attribute__((unused));
const struct stack *unused_stack __attribute__((unused));
const struct sample *unused_sample __attribute__((unused));
const struct object *unused_object __attribute__((unused));
const enum rec_type *unused_rec_type __attribute__((unused));
const enum limits *unused_limits __attribute__((unused));
const enum trace_state *unused_trace_state __attribute__((unused));
const enum op *unused_op __attribute__((unused));
const enum event_flag *unused_event_flag __attribute__((unused));
const enum cookie_layout *unused_cookie_layout __attribute__((unused));
const enum glibc_layout *unused_glibc_layout __attribute__((unused));
