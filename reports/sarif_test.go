package reports

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/santhosh-tekuri/jsonschema/v6"
)

// sarifSchemas compiles the SARIF 2.1.0 JSON schemas committed in
// testdata, with format assertions on: the OASIS TC's schema (draft-07)
// and the 2.1.0-rtm.5 schema (draft-04) that editors use. They differ in
// small ways (suppression.state against suppression.status); a log must
// satisfy both.
func compileSARIFSchemas(t *testing.T) []*jsonschema.Schema {
	t.Helper()
	var out []*jsonschema.Schema
	for _, file := range []string{"sarif-schema-2.1.0.json", "sarif-schema-2.1.0-rtm.5.json"} {
		f, err := os.Open(filepath.Join("testdata", file))
		if err != nil {
			t.Fatal(err)
		}
		doc, err := jsonschema.UnmarshalJSON(f)
		f.Close()
		if err != nil {
			t.Fatal(err)
		}
		m, _ := doc.(map[string]any)
		id, _ := m["$id"].(string)
		if id == "" {
			id, _ = m["id"].(string) // draft-04
		}
		if title, _ := m["title"].(string); !strings.Contains(title, "SARIF) Version 2.1.0") || id == "" {
			t.Fatalf("%s is not a SARIF 2.1.0 schema", file)
		}
		c := jsonschema.NewCompiler()
		c.AssertFormat()
		if err := c.AddResource(id, doc); err != nil {
			t.Fatal(err)
		}
		s, err := c.Compile(id)
		if err != nil {
			t.Fatalf("%s: %v", file, err)
		}
		out = append(out, s)
	}
	return out
}

func validateSARIF(t *testing.T, schemas []*jsonschema.Schema, name string, data []byte) {
	t.Helper()
	inst, err := jsonschema.UnmarshalJSON(bytes.NewReader(data))
	if err != nil {
		t.Fatalf("%s: not JSON: %v", name, err)
	}
	for _, s := range schemas {
		if err := s.Validate(inst); err != nil {
			t.Errorf("%s does not validate against the SARIF 2.1.0 schema:\n%v", name, err)
		}
	}
}

// TestSARIFSchema validates every SARIF report, the committed golden files
// and fresh renders, against the 2.1.0 schema, and checks that the
// validator does reject broken logs.
func TestSARIFSchema(t *testing.T) {
	s := compileSARIFSchemas(t)
	goldens, _ := filepath.Glob(filepath.Join("testdata", "golden", "*.sarif"))
	if len(goldens) < 3 {
		t.Fatalf("want SARIF golden files, found %v", goldens)
	}
	for _, path := range goldens {
		data, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		validateSARIF(t, s, path, data)
	}
	for _, c := range gateCases() {
		validateSARIF(t, s, c.name, renderCase(t, c, "sarif"))
	}
	// No findings, an incomplete trace: still valid.
	res := openMPISeed(false)
	res.Findings = nil
	var buf bytes.Buffer
	if err := SARIF(&buf, plain(res)); err != nil {
		t.Fatal(err)
	}
	validateSARIF(t, s, "empty", buf.Bytes())

	// The validator catches what it should.
	for _, c := range []struct{ name, from, to string }{
		{"bad level", `"level": "error"`, `"level": "fatal"`},
		{"bad version", `"version": "2.1.0"`, `"version": "2.0.0"`},
		{"unknown property", `"ruleId":`, `"rule_id": "x", "ruleId":`},
	} {
		broken := strings.Replace(string(renderCase(t, gateCases()[1], "sarif")), c.from, c.to, 1)
		inst, _ := jsonschema.UnmarshalJSON(strings.NewReader(broken))
		for i, schema := range s {
			if err := schema.Validate(inst); err == nil {
				t.Errorf("%s: schema %d accepted a broken log", c.name, i)
			}
		}
	}
}

type sarifDoc struct {
	Runs []struct {
		Tool struct {
			Driver struct {
				Rules []struct {
					ID string `json:"id"`
				} `json:"rules"`
			} `json:"driver"`
		} `json:"tool"`
		Invocations []struct {
			Notifications []struct {
				Message struct {
					Text string `json:"text"`
				} `json:"message"`
			} `json:"toolExecutionNotifications"`
		} `json:"invocations"`
		OriginalURIBaseIDs map[string]struct {
			URI string `json:"uri"`
		} `json:"originalUriBaseIds"`
		Results []struct {
			RuleID              string            `json:"ruleId"`
			RuleIndex           int               `json:"ruleIndex"`
			Level               string            `json:"level"`
			PartialFingerprints map[string]string `json:"partialFingerprints"`
			BaselineState       string            `json:"baselineState"`
			Locations           []sarifLocation   `json:"locations"`
			CodeFlows           []struct {
				ThreadFlows []struct {
					Locations []struct {
						Location sarifLocation `json:"location"`
						Stack    *struct {
							Frames []json.RawMessage `json:"frames"`
						} `json:"stack"`
					} `json:"locations"`
				} `json:"threadFlows"`
			} `json:"codeFlows"`
			Suppressions []struct {
				Justification string `json:"justification"`
			} `json:"suppressions"`
		} `json:"results"`
		Properties map[string]any `json:"properties"`
	} `json:"runs"`
}

// TestSARIFContent checks what code scanning relies on: one result per
// finding, the finding ID as partial fingerprint, a thread flow per edge,
// file:line locations relative to the source root, baseline states and
// suppressions.
func TestSARIFContent(t *testing.T) {
	c := gateCases()[2] // regress against the seed baseline, suppressions
	g, err := Judge(analyzeFixture(t, c.fixture), c.opts(t))
	if err != nil {
		t.Fatal(err)
	}
	var buf bytes.Buffer
	if err := SARIF(&buf, g); err != nil {
		t.Fatal(err)
	}
	var doc sarifDoc
	if err := json.Unmarshal(buf.Bytes(), &doc); err != nil {
		t.Fatal(err)
	}
	if len(doc.Runs) != 1 {
		t.Fatalf("%d runs", len(doc.Runs))
	}
	run := doc.Runs[0]
	if len(run.Results) != len(g.Findings) {
		t.Fatalf("%d results for %d findings", len(run.Results), len(g.Findings))
	}
	if run.OriginalURIBaseIDs[srcRoot].URI != "file:///src/app/" {
		t.Errorf("originalUriBaseIds %+v", run.OriginalURIBaseIDs)
	}
	for i, r := range run.Results {
		j := &g.Findings[i]
		if r.PartialFingerprints[FingerprintKey] != j.ID {
			t.Errorf("result %d fingerprint %v, want %s", i, r.PartialFingerprints, j.ID)
		}
		if r.RuleID != string(j.Kind) || run.Tool.Driver.Rules[r.RuleIndex].ID != r.RuleID {
			t.Errorf("result %d rule %s/%d", i, r.RuleID, r.RuleIndex)
		}
		if r.BaselineState != j.State {
			t.Errorf("result %d baselineState %q, want %q", i, r.BaselineState, j.State)
		}
		if len(r.CodeFlows) != 1 || len(r.CodeFlows[0].ThreadFlows) != len(j.Edges) {
			t.Errorf("result %d: want one code flow with %d thread flows", i, len(j.Edges))
		}
		if (len(r.Suppressions) == 1) != (j.Suppressed != nil) {
			t.Errorf("result %d suppressions %+v", i, r.Suppressions)
		}
		if len(r.Locations) != 1 || r.Locations[0].PhysicalLocation == nil {
			t.Errorf("result %d has no physical location", i)
		}
	}
	// The inversion: pool.c/cache.c lines, relative to the source root.
	inv := run.Results[0]
	loc := inv.Locations[0].PhysicalLocation
	if inv.Level != "error" || loc.ArtifactLocation.URI != "pool/cache.c" || loc.ArtifactLocation.URIBaseID != srcRoot ||
		loc.Region == nil || loc.Region.StartLine != 19 {
		t.Errorf("inversion location %+v %+v", loc.ArtifactLocation, loc.Region)
	}
	flow := inv.CodeFlows[0].ThreadFlows[1].Locations
	if len(flow) != 2 || flow[1].Location.PhysicalLocation.Region.StartLine != 77 || flow[1].Stack == nil || len(flow[1].Stack.Frames) != 4 {
		t.Errorf("second thread flow %+v", flow)
	}
	// The allocator cycle: the malloc call in vma_tree_insert.
	arena := run.Results[1]
	if arena.Locations[0].PhysicalLocation.ArtifactLocation.URI != "rcache/vma_tree.c" {
		t.Errorf("allocator cycle location %+v", arena.Locations[0].PhysicalLocation.ArtifactLocation)
	}
	hook := run.Results[2]
	if hook.Level != "note" || !strings.Contains(hook.Suppressions[0].Justification, "reviewed") {
		t.Errorf("hook-lock result %+v", hook)
	}
	// A path outside the root is an absolute file URI.
	if loc := hook.Locations[0].PhysicalLocation.ArtifactLocation; loc.URI != "file:///opt/vendor/stats.c" || loc.URIBaseID != "" {
		t.Errorf("outside the root: %+v", loc)
	}
	notes := ""
	for _, n := range run.Invocations[0].Notifications {
		notes += n.Message.Text + "\n"
	}
	if !strings.Contains(notes, "Unused suppression at testdata/suppress.txt:9") {
		t.Errorf("notifications lack the unused suppression: %s", notes)
	}
	if fixed, _ := run.Properties["fixed"].([]any); len(fixed) != 1 {
		t.Errorf("run properties: fixed %v", run.Properties["fixed"])
	}
}
