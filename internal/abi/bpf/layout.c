/* The ring's record layout (bpf/hooktrace.h), which the BPF programs and
 * the preloaded library both write, brought into Go for the converter by
 * bpf2go -type. There is no program here: the object bpf2go builds from
 * this file only carries the types' BTF. */
#include <linux/types.h>
#include "../../../bpf/hooktrace.h"

const struct event *unused_event __attribute__((unused));
const struct stack *unused_stack __attribute__((unused));
const struct sample *unused_sample __attribute__((unused));
const struct object *unused_object __attribute__((unused));
const enum rec_type *unused_rec_type __attribute__((unused));
