package policy

import (
	"errors"
	"strings"
	"testing"
)

func TestAuditSection(t *testing.T) {
	c, err := Parse("m.yaml", []byte(head))
	if err != nil {
		t.Fatal(err)
	}
	if c.Audit != (Audit{}) {
		t.Errorf("default audit = %+v, want none", c.Audit)
	}
	c, err = Parse("m.yaml", []byte(head+"audit: {file: /var/log/mcpgate/audit.jsonl, include_arguments: true}\n"))
	if err != nil {
		t.Fatal(err)
	}
	if c.Audit != (Audit{File: "/var/log/mcpgate/audit.jsonl", IncludeArguments: true}) {
		t.Errorf("audit = %+v", c.Audit)
	}
	c, err = Parse("m.yaml", []byte(head+"audit: {file: \"-\"}\n"))
	if err != nil || c.Audit.File != "-" || c.Audit.IncludeArguments {
		t.Errorf("audit stdout = %+v, %v", c.Audit, err)
	}
}

func TestAuditSectionErrors(t *testing.T) {
	for doc, want := range map[string]string{
		"audit: {include_arguments: yes}\n": `m.yaml:3: audit.include_arguments: want true or false, got the string "yes"`,
		"audit: {file: true}\n":             `m.yaml:3: audit.file: want a string, got`,
		"audit: {file: logs/}\n":            `m.yaml:3: audit.file: "logs/" is a directory`,
		"audit: {files: a.log}\n":           `m.yaml:3: audit.files: unknown field (did you mean "file"?)`,
	} {
		_, err := Parse("m.yaml", []byte(head+doc))
		if !errors.Is(err, ErrInvalidConfig) || !strings.Contains(err.Error(), want) {
			t.Errorf("%q: got %v, want %s", doc, err, want)
		}
	}
}
