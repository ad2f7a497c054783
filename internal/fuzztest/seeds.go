package fuzztest

import (
	"bufio"
	"bytes"
	"embed"
	"errors"
	"io"
	"io/fs"
	"path"

	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"sigs.k8s.io/yaml"
)

// manifests are real inputs: the files `sluice-lab apply` writes for
// internal/lab/testdata/demo-services.yaml on a two-node lab (nodes.yaml,
// pods.yaml, svc-*.yaml), and hand-written ones with the Service fields the
// demo leaves out (northsouth.yaml, list.json).
//
//go:embed testdata/manifests
var manifests embed.FS

// Manifest is one seed file.
type Manifest struct {
	Name string
	Data []byte
}

// Manifests returns the seed manifest files, by name.
func Manifests() []Manifest {
	var out []Manifest
	err := fs.WalkDir(manifests, "testdata/manifests", func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		data, err := manifests.ReadFile(p)
		out = append(out, Manifest{Name: path.Base(p), Data: data})
		return err
	})
	if err != nil {
		panic(err) // embedded: cannot fail
	}
	return out
}

// ManifestDocs returns every document of the seed manifests as JSON, with
// the "kind" of each.
func ManifestDocs() (docs [][]byte, kinds []string) {
	for _, m := range Manifests() {
		r := utilyaml.NewYAMLReader(bufio.NewReader(bytes.NewReader(m.Data)))
		for {
			raw, err := r.Read()
			if errors.Is(err, io.EOF) {
				break
			}
			if err != nil {
				panic(m.Name + ": " + err.Error())
			}
			js, err := yaml.YAMLToJSON(raw)
			if err != nil {
				panic(m.Name + ": " + err.Error())
			}
			var tm struct{ Kind string }
			if err := yaml.Unmarshal(js, &tm); err != nil || tm.Kind == "" {
				continue // comments only
			}
			docs = append(docs, js)
			kinds = append(kinds, tm.Kind)
		}
	}
	return docs, kinds
}
