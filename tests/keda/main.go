// Command keda-cosmosdb runs KEDA's own `azure-cosmosdb` scaler (github.com/kedacore/keda/v2,
// package pkg/scalers, built unchanged) once against a Cosmos DB account and prints what KEDA
// would publish: {"metric": <value>, "active": <bool>}, or {"error": "..."} with exit code 1.
//
// Usage: keda-cosmosdb <endpoint> <key> <database> <container> <lease database> <lease container> <processor name> [<changeFeedLagThreshold>]
//
// KEDA publishes min(total lag, ranges with lag × changeFeedLagThreshold (default 100)); a
// threshold above the backlog makes the metric the total lag.
package main

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"time"

	"github.com/kedacore/keda/v2/pkg/scalers"
	"github.com/kedacore/keda/v2/pkg/scalers/scalersconfig"
)

type result struct {
	Metric *float64 `json:"metric,omitempty"`
	Active bool     `json:"active"`
	Error  string   `json:"error,omitempty"`
}

func main() {
	if len(os.Args) != 8 && len(os.Args) != 9 {
		fail(fmt.Errorf("usage: %s <endpoint> <key> <database> <container> <lease database> <lease container> <processor name> [<changeFeedLagThreshold>]", os.Args[0]))
	}
	a := os.Args[1:]
	config := &scalersconfig.ScalerConfig{
		TriggerType:       "azure-cosmosdb",
		GlobalHTTPTimeout: 30 * time.Second,
		TriggerMetadata: map[string]string{
			"databaseId":       a[2],
			"containerId":      a[3],
			"leaseDatabaseId":  a[4],
			"leaseContainerId": a[5],
			"processorName":    a[6],
		},
		AuthParams: map[string]string{
			"connection": fmt.Sprintf("AccountEndpoint=%s;AccountKey=%s", a[0], a[1]),
		},
	}
	if len(a) == 8 {
		config.TriggerMetadata["changeFeedLagThreshold"] = a[7]
	}
	scaler, err := scalers.NewAzureCosmosDBScaler(config)
	if err != nil {
		fail(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	defer scaler.Close(ctx)
	spec := scaler.GetMetricSpecForScaling(ctx)
	if len(spec) != 1 || spec[0].External == nil {
		fail(fmt.Errorf("the scaler has no external metric: %v", spec))
	}
	metrics, active, err := scaler.GetMetricsAndActivity(ctx, spec[0].External.Metric.Name)
	if err != nil {
		fail(err)
	}
	if len(metrics) != 1 {
		fail(fmt.Errorf("expected one metric, got %d", len(metrics)))
	}
	value := metrics[0].Value.AsApproximateFloat64()
	print(result{Metric: &value, Active: active})
}

func print(r result) {
	out, _ := json.Marshal(r)
	fmt.Println(string(out))
}

func fail(err error) {
	print(result{Error: err.Error()})
	os.Exit(1)
}
