//! Schemas of their own in a shared PostgreSQL database, so runs never see each other's rows.

/// `base` with its `search_path` set to `schema`.
pub fn schema_url(base: &str, schema: &str) -> String {
    let sep = if base.contains('?') { '&' } else { '?' };
    format!("{base}{sep}options=-c%20search_path%3D{schema}")
}

/// A fresh schema in the PostgreSQL database at `base`, dropped by [`PgSchema::drop`].
pub struct PgSchema {
    /// The URL latch is given: `base` on this schema.
    pub url: String,
    base: String,
    schema: String,
}

impl PgSchema {
    /// Creates `{prefix}_{ulid}`.
    pub async fn create(base: &str, prefix: &str) -> Result<Self, tokio_postgres::Error> {
        let schema = format!("{prefix}_{}", ulid::Ulid::new().to_string().to_lowercase());
        Self::ensure(base, &schema).await
    }

    /// Creates `schema` unless it exists (a restart on the same data finds its rows).
    pub async fn ensure(base: &str, schema: &str) -> Result<Self, tokio_postgres::Error> {
        let (c, conn) = tokio_postgres::connect(base, tokio_postgres::NoTls).await?;
        tokio::spawn(conn);
        c.batch_execute(&format!("CREATE SCHEMA IF NOT EXISTS {schema}"))
            .await?;
        Ok(Self {
            url: schema_url(base, schema),
            base: base.to_string(),
            schema: schema.to_string(),
        })
    }

    /// The schema's name.
    pub fn schema(&self) -> &str {
        &self.schema
    }

    /// The database's URL without the schema.
    pub fn base(&self) -> &str {
        &self.base
    }

    pub async fn drop(self) -> Result<(), tokio_postgres::Error> {
        let (c, conn) = tokio_postgres::connect(&self.base, tokio_postgres::NoTls).await?;
        tokio::spawn(conn);
        c.batch_execute(&format!("DROP SCHEMA {} CASCADE", self.schema))
            .await
    }
}
