module github.com/sluice-dataplane/sluice

go 1.26.8

require (
	github.com/cilium/ebpf v0.22.0 // indirect
	github.com/fsnotify/fsnotify v1.10.1 // indirect
	github.com/inconshreveable/mousetrap v1.1.0 // indirect
	github.com/prometheus/client_golang v1.25.0 // indirect
	github.com/spf13/cobra v1.10.2 // indirect
	github.com/spf13/pflag v1.0.10 // indirect
	github.com/vishvananda/netlink v1.3.1 // indirect
	github.com/vishvananda/netns v0.0.5 // indirect
	go.yaml.in/yaml/v2 v2.4.4 // indirect
	golang.org/x/sys v0.49.0 // indirect
	k8s.io/api v0.33.4 // indirect
	k8s.io/apimachinery v0.33.4 // indirect
	k8s.io/client-go v0.33.4 // indirect
	sigs.k8s.io/yaml v1.6.0 // indirect
)
