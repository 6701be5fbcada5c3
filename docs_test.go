package lakeshore_test

import (
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"maps"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"

	"gopkg.in/yaml.v3"

	"github.com/dreamlake/lakeshore"
	"github.com/dreamlake/lakeshore/agent"
)

// The facts the docs count or list, and where the code says them: the
// control plane's resources (template.yaml) in docs/deploy.md and README,
// nymph's exit codes (agent/exitcodes.go) in README and the systemd unit.
// Each check takes its inputs as text and answers what disagrees, so
// TestFactsChecksCatch can show it failing on a changed copy.

// resourcesNode reads a template's Resources mapping.
func resourcesNode(src []byte) (*yaml.Node, error) {
	var doc yaml.Node
	if err := yaml.Unmarshal(src, &doc); err != nil {
		return nil, fmt.Errorf("parse the template: %w", err)
	}
	if len(doc.Content) == 0 {
		return nil, fmt.Errorf("the template is empty")
	}
	res := mapping(doc.Content[0], "Resources")
	if res == nil {
		return nil, fmt.Errorf("the template has no Resources")
	}
	return res, nil
}

// templateResources reads template.yaml's resources: logical id → type.
func templateResources(src []byte) (map[string]string, error) {
	res, err := resourcesNode(src)
	if err != nil {
		return nil, err
	}
	out := map[string]string{}
	for i := 0; i+1 < len(res.Content); i += 2 {
		if typ := mapping(res.Content[i+1], "Type"); typ != nil {
			out[res.Content[i].Value] = typ.Value
		}
	}
	return out, nil
}

// deployFacts are the resource kinds docs/deploy.md counts and lists: the
// phrase it counts them with, and their CloudFormation types.
var deployFacts = []struct {
	phrase string
	types  []string
	listed bool // every logical id appears in deploy.md, as `Id`
}{
	{"Lambda functions", []string{"AWS::Serverless::Function"}, true},
	{"DynamoDB tables", []string{"AWS::DynamoDB::Table"}, true},
	{"APIs", []string{"AWS::Serverless::HttpApi", "AWS::ApiGatewayV2::Api"}, true},
	{"alarms", []string{"AWS::CloudWatch::Alarm"}, false},
}

// checkTemplateFacts reports where deploy (docs/deploy.md) disagrees with
// tmpl (template.yaml): a count "N <phrase>" other than the template's
// (each must appear at least once; "N Lambdas" counts as functions too),
// or a function, table or API whose logical id it does not name.
func checkTemplateFacts(tmpl []byte, deploy string) []string {
	res, err := templateResources(tmpl)
	if err != nil {
		return []string{err.Error()}
	}
	var bad []string
	for _, f := range deployFacts {
		var ids []string
		for id, typ := range res {
			if slices.Contains(f.types, typ) {
				ids = append(ids, id)
			}
		}
		slices.Sort(ids)
		phrase := regexp.QuoteMeta(f.phrase)
		if f.phrase == "Lambda functions" {
			phrase = `Lambda functions|Lambdas`
		}
		counts := regexp.MustCompile(`(\d+) (?:`+phrase+`)\b`).FindAllStringSubmatch(deploy, -1)
		if len(counts) == 0 {
			bad = append(bad, fmt.Sprintf("docs/deploy.md never says \"%d %s\" (template.yaml has %d: %s)", len(ids), f.phrase, len(ids), strings.Join(ids, ", ")))
		}
		for _, m := range counts {
			if n, _ := strconv.Atoi(m[1]); n != len(ids) {
				bad = append(bad, fmt.Sprintf("docs/deploy.md says %q; template.yaml has %d: %s", m[0], len(ids), strings.Join(ids, ", ")))
			}
		}
		if !f.listed {
			continue
		}
		for _, id := range ids {
			if !strings.Contains(deploy, "`"+id+"`") {
				bad = append(bad, fmt.Sprintf("docs/deploy.md does not name `%s` (one of template.yaml's %s, %s)", id, f.phrase, res[id]))
			}
		}
	}
	return bad
}

// checkTableNames reports the tables of tmpl whose name (after the
// prefix) README's --table-prefix row does not list.
func checkTableNames(tmpl []byte, readme string) []string {
	res, err := resourcesNode(tmpl)
	if err != nil {
		return []string{err.Error()}
	}
	row := ""
	for _, l := range strings.Split(readme, "\n") {
		if strings.HasPrefix(l, "| `--table-prefix` |") {
			row = l
		}
	}
	if row == "" {
		return []string{"README has no `--table-prefix` row"}
	}
	var bad []string
	for i := 0; i+1 < len(res.Content); i += 2 {
		r := res.Content[i+1]
		if typ := mapping(r, "Type"); typ == nil || typ.Value != "AWS::DynamoDB::Table" {
			continue
		}
		name := mapping(mapping(r, "Properties"), "TableName")
		if name == nil {
			bad = append(bad, fmt.Sprintf("%s: no TableName", res.Content[i].Value))
			continue
		}
		suffix, ok := strings.CutPrefix(name.Value, "${TablePrefix}")
		if !ok {
			bad = append(bad, fmt.Sprintf("%s: TableName is not ${TablePrefix}<name>", res.Content[i].Value))
			continue
		}
		if !strings.Contains(row, "`"+suffix+"`") {
			bad = append(bad, fmt.Sprintf("README's --table-prefix row does not list the table `%s` (%s)", suffix, res.Content[i].Value))
		}
	}
	return bad
}

// exitCodes reads the Exit* constants of agent/exitcodes.go: code → name.
func exitCodes(src []byte) (map[int]string, error) {
	f, err := parser.ParseFile(token.NewFileSet(), "exitcodes.go", src, 0)
	if err != nil {
		return nil, err
	}
	codes := map[int]string{}
	for _, d := range f.Decls {
		g, ok := d.(*ast.GenDecl)
		if !ok || g.Tok != token.CONST {
			continue
		}
		for _, spec := range g.Specs {
			vs := spec.(*ast.ValueSpec)
			for i, name := range vs.Names {
				if !strings.HasPrefix(name.Name, "Exit") || i >= len(vs.Values) {
					continue
				}
				lit, ok := vs.Values[i].(*ast.BasicLit)
				if !ok || lit.Kind != token.INT {
					return nil, fmt.Errorf("%s is not a plain number; this check reads literals", name.Name)
				}
				n, err := strconv.Atoi(lit.Value)
				if err != nil {
					return nil, fmt.Errorf("%s: %w", name.Name, err)
				}
				codes[n] = name.Name
			}
		}
	}
	if len(codes) == 0 {
		return nil, fmt.Errorf("no Exit* constants")
	}
	return codes, nil
}

// unitSetting reads a Key=value line of a systemd unit.
func unitSetting(unit, key string) (string, bool) {
	for _, l := range strings.Split(unit, "\n") {
		if v, ok := strings.CutPrefix(strings.TrimSpace(l), key+"="); ok {
			return strings.TrimSpace(v), true
		}
	}
	return "", false
}

// checkExitCodeFacts reports where README and the systemd unit disagree
// with the exit codes codes (agent/exitcodes.go): README's exit table
// (header "| exit |") must have one row per code, "yes" in its last
// column exactly for the codes the unit restarts; the unit's
// RestartPreventExitStatus must name every code but a clean exit and the
// failure a restart may cure (agent.ExitOK, agent.ExitFailure), and its
// comment must explain each. docs, the other documents, must quote the
// unit's RestartPreventExitStatus wherever they quote it.
func checkExitCodeFacts(codes map[int]string, readme, unit string, docs map[string]string) []string {
	var bad []string
	prevent, ok := unitSetting(unit, "RestartPreventExitStatus")
	if !ok {
		bad = append(bad, "infra/nymph.service has no RestartPreventExitStatus line")
	}
	prevented := map[int]bool{}
	for _, f := range strings.Fields(prevent) {
		n, err := strconv.Atoi(f)
		if err != nil {
			bad = append(bad, fmt.Sprintf("infra/nymph.service: RestartPreventExitStatus names %q, not a code", f))
			continue
		}
		prevented[n] = true
		if _, ok := codes[n]; !ok {
			bad = append(bad, fmt.Sprintf("infra/nymph.service: RestartPreventExitStatus names %d, which agent/exitcodes.go does not define", n))
		}
	}
	for _, n := range slices.Sorted(maps.Keys(codes)) {
		restarted := n == agent.ExitFailure
		if want := n != agent.ExitOK && !restarted; prevented[n] != want {
			bad = append(bad, fmt.Sprintf("infra/nymph.service: RestartPreventExitStatus=%s; %s (%d) should be in it: %v", prevent, codes[n], n, want))
		}
		if !regexp.MustCompile(`(?m)^#\s+` + strconv.Itoa(n) + `\s`).MatchString(unit) {
			bad = append(bad, fmt.Sprintf("infra/nymph.service's comment does not explain exit %d (%s)", n, codes[n]))
		}
	}

	rows := map[int]string{}
	inTable := false
	for _, l := range strings.Split(readme, "\n") {
		switch {
		case strings.HasPrefix(l, "| exit |"):
			inTable = true
		case inTable && strings.HasPrefix(l, "|---"):
		case inTable && strings.HasPrefix(l, "| "):
			cells := strings.Split(strings.Trim(l, "| "), " | ")
			n, err := strconv.Atoi(strings.TrimSpace(cells[0]))
			if err != nil {
				bad = append(bad, fmt.Sprintf("README's exit table: row %q does not start with a code", l))
				continue
			}
			rows[n] = strings.TrimSpace(cells[len(cells)-1])
		default:
			inTable = false
		}
	}
	if len(rows) == 0 {
		bad = append(bad, "README has no exit code table (a header starting \"| exit |\")")
	}
	for _, n := range slices.Sorted(maps.Keys(codes)) {
		last, ok := rows[n]
		if !ok {
			bad = append(bad, fmt.Sprintf("README's exit table has no row for %d (%s)", n, codes[n]))
			continue
		}
		restarted := n != agent.ExitOK && !prevented[n]
		if says := strings.HasPrefix(last, "yes"); says != restarted {
			bad = append(bad, fmt.Sprintf("README's exit table says %d is restarted: %q; the unit restarts it: %v", n, last, restarted))
		}
	}
	for n := range rows {
		if _, ok := codes[n]; !ok {
			bad = append(bad, fmt.Sprintf("README's exit table has a row for %d, which agent/exitcodes.go does not define", n))
		}
	}

	quoted := regexp.MustCompile("RestartPreventExitStatus=([0-9 ]*[0-9])")
	for _, name := range slices.Sorted(maps.Keys(docs)) {
		for _, m := range quoted.FindAllStringSubmatch(docs[name], -1) {
			if m[1] != prevent {
				bad = append(bad, fmt.Sprintf("%s quotes %q; infra/nymph.service has RestartPreventExitStatus=%s", name, m[0], prevent))
			}
		}
	}
	return bad
}

// readText reads a file of the repository.
func readText(t *testing.T, path string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// docsQuotingTheUnit are README and every document under docs/.
func docsQuotingTheUnit(t *testing.T) map[string]string {
	t.Helper()
	docs := map[string]string{"README.md": readText(t, "README.md")}
	paths, err := filepath.Glob("docs/*.md")
	if err != nil || len(paths) == 0 {
		t.Fatalf("docs/*.md: %v (%d files)", err, len(paths))
	}
	for _, p := range paths {
		docs[p] = readText(t, p)
	}
	return docs
}

// TestDocsMatchTheTemplate: docs/deploy.md counts the control plane's
// functions, tables, APIs and alarms as template.yaml has them and names
// each function, table and API; README's --table-prefix row lists every
// table.
func TestDocsMatchTheTemplate(t *testing.T) {
	for _, b := range append(checkTemplateFacts(lakeshore.Template, readText(t, "docs/deploy.md")),
		checkTableNames(lakeshore.Template, readText(t, "README.md"))...) {
		t.Error(b)
	}
}

// TestDocsListEveryExitCode: every exit code of agent/exitcodes.go is in
// README's exit table and in infra/nymph.service, which keeps down the
// codes a restart cannot cure, and the docs quote the unit as it is.
func TestDocsListEveryExitCode(t *testing.T) {
	codes, err := exitCodes([]byte(readText(t, "agent/exitcodes.go")))
	if err != nil {
		t.Fatal(err)
	}
	for _, b := range checkExitCodeFacts(codes, readText(t, "README.md"), readText(t, "infra/nymph.service"), docsQuotingTheUnit(t)) {
		t.Error(b)
	}
}

// TestFactsChecksCatch: the checks above fail on a template with one more
// function or table, a README missing an exit code, an exit code the unit
// does not keep down, and a document quoting an old unit.
func TestFactsChecksCatch(t *testing.T) {
	deploy, readme, unit := readText(t, "docs/deploy.md"), readText(t, "README.md"), readText(t, "infra/nymph.service")
	codes, err := exitCodes([]byte(readText(t, "agent/exitcodes.go")))
	if err != nil {
		t.Fatal(err)
	}
	extra := func(id, typ string) []byte {
		return []byte(strings.Replace(string(lakeshore.Template), "\nResources:\n", "\nResources:\n  "+id+":\n    Type: "+typ+"\n    Properties:\n      TableName: !Sub \"${TablePrefix}extra\"\n", 1))
	}
	last := slices.Max(slices.Collect(maps.Keys(codes)))
	more := maps.Clone(codes)
	more[last+1] = "ExitNew"
	withoutLast := regexp.MustCompile(`(?m)^\| `+strconv.Itoa(last)+` \|.*\n`).ReplaceAllString(readme, "")
	for _, c := range []struct {
		name string
		bad  []string
		want string
	}{
		{"a function more", checkTemplateFacts(extra("ExtraFunction", "AWS::Serverless::Function"), deploy), "ExtraFunction"},
		{"a table more", checkTemplateFacts(extra("ExtraTable", "AWS::DynamoDB::Table"), deploy), "ExtraTable"},
		{"a table README does not name", checkTableNames(extra("ExtraTable", "AWS::DynamoDB::Table"), readme), "`extra`"},
		{"an exit code README misses", checkExitCodeFacts(codes, withoutLast, unit, nil), fmt.Sprintf("no row for %d", last)},
		{"an exit code more", checkExitCodeFacts(more, readme, unit, nil), "ExitNew"},
		{"a document quoting an old unit", checkExitCodeFacts(codes, readme, unit, map[string]string{"docs/old.md": "RestartPreventExitStatus=2 3 4"}), "docs/old.md"},
	} {
		if !slices.ContainsFunc(c.bad, func(s string) bool { return strings.Contains(s, c.want) }) {
			t.Errorf("%s: the check reported %q; want a problem naming %s", c.name, c.bad, c.want)
		}
	}
}
