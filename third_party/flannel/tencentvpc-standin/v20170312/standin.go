// Package v20170312 stands in for Tencent Cloud's VPC client, which the Go
// module proxy does not serve: flanneld links its tencent-vpc backend,
// the lab uses only the vxlan one. Every call fails with errNotBuilt.
package v20170312

import "errors"

var errNotBuilt = errors.New("the tencent-vpc backend is not built into the sluice lab's flanneld (its SDK is not served by the Go module proxy)")

type Client struct{}

func NewClientWithSecretId(secretID, secretKey, region string) (*Client, error) {
	return nil, errNotBuilt
}

type Filter struct {
	Name   *string
	Values []*string
}

type Route struct {
	DestinationCidrBlock *string
	GatewayType          *string
	GatewayId            *string
	RouteId              *uint64
	RouteType            *string
	Enabled              *bool
}

type RouteTable struct {
	RouteTableId *string
	RouteSet     []*Route
}

type DescribeRouteTablesRequest struct{ Filters []*Filter }

type DescribeRouteTablesResponse struct {
	Response *struct{ RouteTableSet []*RouteTable }
}

type DeleteRoutesRequest struct {
	RouteTableId *string
	Routes       []*Route
}

type CreateRoutesRequest struct {
	RouteTableId *string
	Routes       []*Route
}

type DeleteRoutesResponse struct{}
type CreateRoutesResponse struct{}

func NewDescribeRouteTablesRequest() *DescribeRouteTablesRequest { return &DescribeRouteTablesRequest{} }
func NewDeleteRoutesRequest() *DeleteRoutesRequest               { return &DeleteRoutesRequest{} }
func NewCreateRoutesRequest() *CreateRoutesRequest               { return &CreateRoutesRequest{} }

func (c *Client) DescribeRouteTables(*DescribeRouteTablesRequest) (*DescribeRouteTablesResponse, error) {
	return nil, errNotBuilt
}
func (c *Client) DeleteRoutes(*DeleteRoutesRequest) (*DeleteRoutesResponse, error) { return nil, errNotBuilt }
func (c *Client) CreateRoutes(*CreateRoutesRequest) (*CreateRoutesResponse, error) { return nil, errNotBuilt }
