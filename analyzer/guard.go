package analyzer

// Guarded cycles (Goodlock): a cycle whose every dependency was only ever
// seen while its thread held one same other lock, exclusively, cannot
// deadlock: the paths that make it exclude each other. It will the day
// one of them stops taking that lock, so it is a warning naming the gate,
// not silence.

// guard narrows ed's gate candidates to the locks t holds exclusively now,
// besides the dependency's own two. The first sighting sets them.
func (t *thread) guard(ed *edge) {
	if ed.guardSeen && len(ed.guards) == 0 {
		return // unguarded for good
	}
	if !ed.guardSeen {
		ed.guardSeen = true
		for i := range t.held {
			h := &t.held[i]
			if !h.read && h.inst != ed.from && h.inst != ed.to {
				ed.guards = append(ed.guards, h.inst)
			}
		}
		return
	}
	keep := ed.guards[:0]
	for _, g := range ed.guards {
		if i := t.findHeld(g.addr); i >= 0 && t.held[i].inst == g && !t.held[i].read {
			keep = append(keep, g)
		}
	}
	ed.guards = keep
}

// unguard marks a dependency seen on a path no gate covers (through a
// hook, or the allocator).
func (ed *edge) unguard() {
	ed.guardSeen = true
	ed.guards = nil
}

// cycleGate is the lock every dependency of cyc was seen under, if any
// (the oldest such lock, so the choice is deterministic).
func cycleGate(cyc []cycleStep) *instance {
	var common []*instance
	for i, st := range cyc {
		ed := st.edge
		if !ed.guardSeen || len(ed.guards) == 0 {
			return nil
		}
		if i == 0 {
			common = append(common, ed.guards...)
			continue
		}
		keep := common[:0]
		for _, g := range common {
			for _, h := range ed.guards {
				if g == h {
					keep = append(keep, g)
					break
				}
			}
		}
		common = keep
		if len(common) == 0 {
			return nil
		}
	}
	var gate *instance
	for _, g := range common {
		onCycle := false
		for _, st := range cyc {
			onCycle = onCycle || st.edge.from == g
		}
		if !onCycle && (gate == nil || g.id < gate.id) {
			gate = g
		}
	}
	return gate
}

// guardedSeverity is a cycle's severity: a guarded error is a warning.
func guardedSeverity(cyc []cycleStep) Severity {
	sev := cycleSeverity(cyc)
	if sev == SeverityError && cycleGate(cyc) != nil {
		return SeverityWarning
	}
	return sev
}

// describeGate names a class cycle's gate: the finding is guarded only
// when its representative (the most severe instance cycle) is.
func describeGate(n *naming, f *Finding, rep []cycleStep) {
	g := cycleGate(rep)
	if g == nil {
		return
	}
	f.Gate = n.of(g)
	f.Title += " (guarded by " + f.Gate + ")"
	f.Detail = "Every dependency on this cycle was only ever taken while its thread held " + f.Gate +
		": the paths exclude each other, so this cannot deadlock while every path holds " + f.Gate +
		"; it will the day one path stops taking it. " + f.Detail
}
