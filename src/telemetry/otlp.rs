//! OpenTelemetry traces over OTLP/HTTP (protobuf), on when `otlp_endpoint` is set.
//!
//! The spans are `tracing` spans of target [`super::SPANS`], turned into OpenTelemetry
//! spans by `tracing-opentelemetry` and sent in batches by the SDK's batch processor, on a
//! thread of its own with a blocking HTTP client: exporting never runs on (or waits for)
//! the runtime that serves readings. A collector that is down costs dropped spans and a
//! logged error per batch, never a slower latch. The SDK's `OTEL_*` variables apply
//! (`OTEL_EXPORTER_OTLP_HEADERS` for a collector's credentials, `OTEL_BSP_*` for the
//! batches, `OTEL_SERVICE_NAME`, `OTEL_RESOURCE_ATTRIBUTES`).

use opentelemetry::trace::TracerProvider as _;
use opentelemetry_otlp::{SpanExporter, WithExportConfig};
use opentelemetry_sdk::Resource;
use opentelemetry_sdk::trace::{SdkTracerProvider, Tracer};

/// Why traces could not be set up; latch does not start then.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error(
        "invalid setting `otlp_endpoint`: {0:?} is not an http:// or https:// URL \
         (e.g. http://127.0.0.1:4318)"
    )]
    Endpoint(String),
    #[error("cannot set up the OTLP exporter: {0}")]
    Exporter(#[from] opentelemetry_otlp::ExporterBuildError),
}

/// Where the spans go: a collector's base URL (`http://collector:4318`) gets the OTLP
/// traces path `/v1/traces`, as `OTEL_EXPORTER_OTLP_ENDPOINT` does; a URL with a path is
/// taken as the full traces URL.
pub fn traces_url(endpoint: &str) -> Result<String, Error> {
    let bad = || Error::Endpoint(endpoint.to_string());
    let url = reqwest::Url::parse(endpoint).map_err(|_| bad())?;
    if !matches!(url.scheme(), "http" | "https") || url.host_str().is_none() {
        return Err(bad());
    }
    if url.path() == "/" {
        Ok(format!("{}/v1/traces", endpoint.trim_end_matches('/')))
    } else {
        Ok(endpoint.to_string())
    }
}

/// The tracer provider exporting to `endpoint`, and a tracer of it for the layer. Must be
/// called outside any Tokio runtime: the blocking HTTP client starts one of its own.
pub fn provider(endpoint: &str) -> Result<(SdkTracerProvider, Tracer), Error> {
    let exporter = SpanExporter::builder()
        .with_http()
        .with_endpoint(traces_url(endpoint)?)
        .build()?;
    let mut resource = Resource::builder().with_attribute(opentelemetry::KeyValue::new(
        "service.version",
        env!("CARGO_PKG_VERSION"),
    ));
    if std::env::var_os("OTEL_SERVICE_NAME").is_none() {
        resource = resource.with_service_name("latch");
    }
    let provider = SdkTracerProvider::builder()
        .with_batch_exporter(exporter)
        .with_resource(resource.build())
        .build();
    let tracer = provider.tracer("latch");
    Ok((provider, tracer))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_base_url_gets_the_traces_path_and_a_full_one_is_kept() {
        let url = |e| traces_url(e).unwrap();
        assert_eq!(
            url("http://127.0.0.1:4318"),
            "http://127.0.0.1:4318/v1/traces"
        );
        assert_eq!(
            url("http://collector:4318/"),
            "http://collector:4318/v1/traces"
        );
        assert_eq!(
            url("https://otel.example.com/custom/traces"),
            "https://otel.example.com/custom/traces"
        );
    }

    #[test]
    fn an_endpoint_that_is_not_an_http_url_is_refused_by_name() {
        for bad in [
            "127.0.0.1:4318",
            "grpc://collector:4317",
            "http://",
            "collector",
        ] {
            let e = traces_url(bad).unwrap_err().to_string();
            assert!(e.contains("otlp_endpoint"), "{bad}: {e}");
        }
    }
}
