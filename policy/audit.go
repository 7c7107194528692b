package policy

import "gopkg.in/yaml.v3"

func (d *decoder) audit(n *yaml.Node, path string, a *Audit) {
	d.object(n, path, fields{
		"file": func(v *yaml.Node, p string) {
			if s, ok := d.str(v, p); ok {
				if s != "" && s != "-" && s[len(s)-1] == '/' {
					d.errf(v, p, "%q is a directory: want a file path, or - for standard output", s)
					return
				}
				a.File = s
			}
		},
		"include_arguments": func(v *yaml.Node, p string) { a.IncludeArguments, _ = d.bool(v, p) },
	})
}
