//! A site's loss a silence kept from a client, told at the silence's end while the site is
//! still down, on PostgreSQL (`domain::site::retell`).

use super::super::Result;
use super::db::{Sql, Tx};
use super::site_rows::{SITE_ROW, linked, members, site_row};
use crate::domain::site::retell;
use crate::store::rules::silences::SiteRetold;

/// Tells `client` the loss of site `site` if it is down and a silence kept its loss from
/// the client. The site's row is locked: a round deciding it waits.
pub(super) async fn retell(
    tx: &Tx<'_>,
    site: &str,
    client: &str,
    now: i64,
) -> Result<Option<SiteRetold>> {
    let Some(row) = tx
        .query_opt(
            &format!("SELECT {SITE_ROW} FROM sites WHERE id = $1 FOR UPDATE"),
            &[&site],
        )
        .await?
    else {
        return Ok(None);
    };
    let (site, state) = site_row(&row);
    if !state.down {
        return Ok(None);
    }
    let Some(c) = linked(tx, &site.id)
        .await?
        .into_iter()
        .find(|l| l.client_id == client)
    else {
        return Ok(None);
    };
    let members = members(tx, &site.id).await?;
    let Some(r) = retell::retell(&site, &state, &members, &c, now) else {
        return Ok(None);
    };
    let made = super::site_rows::insert_one(tx, client, &r.made.event, r.made.body.as_deref(), now)
        .await?;
    Ok(Some(SiteRetold {
        made,
        named: r.named,
        site: site.id,
        client: client.to_string(),
    }))
}

/// Writes that the site's loss told the client: its return goes to it too.
pub(super) async fn told(tx: &Tx<'_>, r: &SiteRetold) -> Result<()> {
    // Added to the list as it is now: another client may have been told meanwhile.
    tx.execute(
        "UPDATE sites SET told_clients = told_clients || $2 || ',', \
         retold = retold || $2 || '@' || released || ',' \
         WHERE id = $1 AND strpos(told_clients, ',' || $2 || ',') = 0",
        &[&r.site, &r.client],
    )
    .await?;
    Ok(())
}
