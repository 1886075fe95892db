//! API tokens created and deleted: in the store, which every node's token table follows.

use super::{App, Result};
use crate::domain::token::ApiToken;

impl App {
    pub async fn create_token(&self, token: ApiToken) -> Result<()> {
        Ok(self.0.store.create_token(token).await?)
    }

    /// `false`: no such token.
    pub async fn delete_token(&self, id: String) -> Result<bool> {
        Ok(self.0.store.delete_token(id).await?)
    }
}
