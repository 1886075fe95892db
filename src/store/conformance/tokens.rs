//! API tokens: kept by hash, listed oldest first, deleted once.

use super::*;
use crate::domain::token::{ApiToken, Scope, hash};

fn token(id: &str, scopes: &[Scope]) -> ApiToken {
    ApiToken {
        id: id.into(),
        name: format!("token {id}"),
        scopes: scopes.to_vec(),
        hash: hash(&format!("secret of {id}")),
        created_at: 3_000,
    }
}

pub(super) async fn tokens_keep_hash_and_scopes(s: &Subject) {
    assert!(s.list_tokens().await.unwrap().is_empty());
    let b = token("01B", &[Scope::Ingest, Scope::Read]);
    let a = token("01A", &[Scope::Admin]);
    s.create_token(b.clone()).await.unwrap();
    s.create_token(a.clone()).await.unwrap();
    assert_eq!(s.list_tokens().await.unwrap(), vec![a.clone(), b.clone()]);
    let again = ApiToken {
        hash: hash("another secret"),
        ..a.clone()
    };
    assert!(matches!(
        s.create_token(again).await,
        Err(Error::Conflict(_))
    ));
}

pub(super) async fn deleted_tokens_are_gone(s: &Subject) {
    let a = token("01A", &[Scope::Read]);
    s.create_token(a.clone()).await.unwrap();
    s.create_token(token("01B", &[Scope::Admin])).await.unwrap();
    assert!(s.delete_token("01A".into()).await.unwrap());
    assert!(!s.delete_token("01A".into()).await.unwrap());
    assert!(!s.delete_token("nope".into()).await.unwrap());
    let left = s.list_tokens().await.unwrap();
    assert_eq!(left.len(), 1);
    assert_eq!(left[0].id, "01B");
}
