// SPDX-FileCopyrightText: Copyright 2025 Stacklok, Inc.
// SPDX-License-Identifier: Apache-2.0
//
// Modified by the mcpgate authors for benchmarking (see ../README.md): the
// CRD types of pkg/ratelimit/types, with metav1.Duration replaced by a
// struct of the same shape and the kubebuilder markers dropped.

package ratelimit

import "time"

// Duration stands for metav1.Duration.
type Duration struct {
	Duration time.Duration
}

// RateLimitConfig defines rate limiting configuration for an MCP server.
// At least one of shared, perUser, or tools must be configured.
type RateLimitConfig struct {
	// Shared is a token bucket shared across all users for the entire server.
	Shared *RateLimitBucket
	// PerUser is a token bucket applied independently to each authenticated user
	// at the server level.
	PerUser *RateLimitBucket
	// Tools defines per-tool rate limit overrides.
	Tools []ToolRateLimitConfig
}

// RateLimitBucket defines a token bucket configuration with a maximum capacity
// and a refill period.
type RateLimitBucket struct {
	// MaxTokens is the maximum number of tokens (bucket capacity).
	MaxTokens int32
	// RefillPeriod is the duration to fully refill the bucket from zero to maxTokens.
	RefillPeriod Duration
}

// ToolRateLimitConfig defines rate limits for a specific tool.
type ToolRateLimitConfig struct {
	// Name is the MCP tool name this limit applies to.
	Name string
	// Shared token bucket for this specific tool.
	Shared *RateLimitBucket
	// PerUser token bucket configuration for this tool.
	PerUser *RateLimitBucket
}
