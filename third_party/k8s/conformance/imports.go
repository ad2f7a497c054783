//go:build conformance

// Package conformance is never built. It names the packages that Kubernetes'
// conformance test binary needs, so that `go mod tidy` (which reads every file
// whatever its build tags) keeps their modules in go.mod and go.sum and
// scripts/conformance-build.sh can run, with -mod=readonly,
//
//	go test -c k8s.io/kubernetes/test/e2e
//
// The e2e.test binary is the test of package k8s.io/kubernetes/test/e2e, and
// tidy does not follow the tests of a dependency: its e2e_test.go imports
// (every test suite, the framework's init packages, ginkgo) have to be named
// here. The list is the non-standard imports of test/e2e/e2e_test.go at the
// pinned release; compare it with that file when moving to another release.
// agnhost, a command, is a tool directive in go.mod instead.
package conformance

import (
	_ "k8s.io/kubernetes/test/e2e"

	// test/e2e/e2e_test.go
	_ "github.com/onsi/ginkgo/v2"
	_ "k8s.io/component-base/version"
	_ "k8s.io/klog/v2"
	_ "k8s.io/kubernetes/test/conformance/testdata"
	_ "k8s.io/kubernetes/test/e2e/apimachinery"
	_ "k8s.io/kubernetes/test/e2e/apps"
	_ "k8s.io/kubernetes/test/e2e/architecture"
	_ "k8s.io/kubernetes/test/e2e/auth"
	_ "k8s.io/kubernetes/test/e2e/autoscaling"
	_ "k8s.io/kubernetes/test/e2e/cloud"
	_ "k8s.io/kubernetes/test/e2e/common"
	_ "k8s.io/kubernetes/test/e2e/dra"
	_ "k8s.io/kubernetes/test/e2e/feature"
	_ "k8s.io/kubernetes/test/e2e/framework"
	_ "k8s.io/kubernetes/test/e2e/framework/config"
	_ "k8s.io/kubernetes/test/e2e/framework/debug/init"
	_ "k8s.io/kubernetes/test/e2e/framework/metrics/init"
	_ "k8s.io/kubernetes/test/e2e/framework/node/init"
	_ "k8s.io/kubernetes/test/e2e/framework/testfiles"
	_ "k8s.io/kubernetes/test/e2e/instrumentation"
	_ "k8s.io/kubernetes/test/e2e/kubectl"
	_ "k8s.io/kubernetes/test/e2e/lifecycle"
	_ "k8s.io/kubernetes/test/e2e/lifecycle/bootstrap"
	_ "k8s.io/kubernetes/test/e2e/network"
	_ "k8s.io/kubernetes/test/e2e/node"
	_ "k8s.io/kubernetes/test/e2e/scheduling"
	_ "k8s.io/kubernetes/test/e2e/storage"
	_ "k8s.io/kubernetes/test/e2e/storage/csimock"
	_ "k8s.io/kubernetes/test/e2e/storage/external"
	_ "k8s.io/kubernetes/test/e2e/testing-manifests"
	_ "k8s.io/kubernetes/test/e2e/windows"
	_ "k8s.io/kubernetes/test/fixtures"
	_ "k8s.io/kubernetes/test/utils/format"
	_ "sigs.k8s.io/yaml/goyaml.v2"
)
