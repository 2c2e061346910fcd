package analyzer

import (
	"strconv"

	"github.com/hooktrace/hooktrace/events"
)

// instance is one lock during one lifetime at one address.
type instance struct {
	id     int32
	stream *stream
	pid    uint32
	addr   uint64
	typ    lockType

	recursive         bool // a recursive mutex
	errorCheck        bool // an error-checking mutex
	nonRecursiveReads bool // a rwlock whose readers queue behind writers

	name       string        // the lock's symbol, when static
	initStack  *events.Stack // pthread_mutex_init's stack, if seen
	firstStack *events.Stack // the first acquisition's stack (or misuse's, until one)
	used       bool          // taken at least once

	// Lifetime and folding (fold.go). id is a slot, reused once the
	// instance is folded; seq orders instances by creation.
	seq     int64
	weight  uint64  // instances this one stands for: itself and its folded twins
	local   uint64  // of those, in its own process (rankfold.go folds other traces' in)
	in, out []*edge // its dependencies
	dead    bool    // its lifetime ended
	folded  bool    // merged into a twin, or dropped
	pinned  bool    // a finding refers to it by id: never folded
	sig     string  // its cluster's signature, while it represents its twins
}

// class groups instances for naming and deduplication: a static lock's
// symbol, else the site that initialised or first took it.
type class struct {
	name      string // for people
	key       string // for finding IDs: no addresses, offsets or paths
	instances []*instance
}

// naming is the classes and labels of all used instances, computed when a
// Result is built (a lock's symbol may arrive after its first use).
type naming struct {
	class []*class // by instance id
	label []string // by instance id
	order []*class // classes in the order first seen
	keyed map[string]*class
}

func (a *Analyzer) nameInstances() *naming {
	n := &naming{
		class: make([]*class, len(a.instances)),
		label: make([]string, len(a.instances)),
		keyed: map[string]*class{},
	}
	for _, inst := range a.liveInstances() {
		if !inst.used {
			continue
		}
		name, key := classOf(inst)
		c := n.keyed[name]
		if c == nil {
			c = &class{name: name, key: key}
			n.keyed[name] = c
			n.order = append(n.order, c)
		}
		c.instances = append(c.instances, inst)
		n.class[inst.id] = c
	}
	// Instances of one class in one process are told apart by their order
	// of first use; instances in different processes by their process.
	type procKey struct {
		stream int
		pid    uint32
	}
	for _, c := range n.order {
		perProc := map[procKey][]*instance{}
		total := map[procKey]uint64{}
		for _, inst := range c.instances {
			k := procKey{inst.stream.index, inst.pid}
			perProc[k] = append(perProc[k], inst)
			total[k] += inst.local
		}
		for _, inst := range c.instances {
			n.label[inst.id] = c.name
		}
		for k, insts := range perProc {
			if total[k] < 2 {
				continue
			}
			// A folded instance's twins were created after it: the
			// numbers go on past them.
			num := uint64(1)
			for _, inst := range insts {
				n.label[inst.id] = c.name + " #" + strconv.FormatUint(num, 10)
				num += inst.local
			}
		}
	}
	return n
}

// weight is how many instances the class had, folded ones included.
func (c *class) weight() int {
	n := uint64(0)
	for _, inst := range c.instances {
		n += inst.weight
	}
	return int(n)
}

func classOf(inst *instance) (name, key string) {
	word := inst.typ.word()
	switch {
	case inst.typ == typeArena:
		return inst.name, "arena " + inst.stream.allocator
	case inst.name != "":
		return inst.name, "symbol " + inst.name
	case callerFrame(inst.initStack) != nil:
		f := callerFrame(inst.initStack)
		return word + " initialised at " + site(f), word + " initialised at " + stableSite(f)
	case callerFrame(inst.firstStack) != nil:
		// A lock never taken, only misused (unlocked), is named by that.
		verb := " first taken at "
		if !inst.used {
			verb = " first used at "
		}
		f := callerFrame(inst.firstStack)
		return word + verb + site(f), word + verb + stableSite(f)
	}
	return word + " (no name, no stack)", word + " unnamed"
}

func (n *naming) of(inst *instance) string {
	if l := n.label[inst.id]; l != "" {
		return l
	}
	name, _ := classOf(inst)
	return name
}

// className is inst's class name, without the " #n" of n.of.
func (n *naming) className(inst *instance) string {
	if c := n.class[inst.id]; c != nil {
		return c.name
	}
	name, _ := classOf(inst)
	return name
}

func (n *naming) key(inst *instance) string {
	if c := n.class[inst.id]; c != nil {
		return c.key
	}
	_, key := classOf(inst)
	return key
}
