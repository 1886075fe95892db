//! A site's loss a silence kept from a client, told at the silence's end while the site is
//! still down, on the embedded store (`domain::site::retell`).

use rusqlite::{OptionalExtension, Transaction, params};

use super::super::Result;
use super::site_rows::{SITE_ROW, linked, members, site_row};
use crate::domain::site::retell;
use crate::store::rules::silences::SiteRetold;

/// Tells `client` the loss of site `site` if it is down and a silence kept its loss from
/// the client.
pub(super) fn retell(
    tx: &Transaction,
    site: &str,
    client: &str,
    now: i64,
) -> Result<Option<SiteRetold>> {
    let Some((site, state)) = tx
        .prepare_cached(&format!("SELECT {SITE_ROW} FROM sites WHERE id = ?1"))?
        .query_row([site], site_row)
        .optional()?
    else {
        return Ok(None);
    };
    if !state.down {
        return Ok(None);
    }
    let Some(c) = linked(tx, &site.id)?
        .into_iter()
        .find(|l| l.client_id == client)
    else {
        return Ok(None);
    };
    let members = members(tx, &site.id)?;
    let Some(r) = retell::retell(&site, &state, &members, &c, now) else {
        return Ok(None);
    };
    let made =
        super::site_rows::insert_one(tx, client, &r.made.event, r.made.body.as_deref(), now)?;
    Ok(Some(SiteRetold {
        made,
        named: r.named,
        site: site.id,
        client: client.to_string(),
    }))
}

/// Writes that the site's loss told the client: its return goes to it too.
pub(super) fn told(tx: &Transaction, r: &SiteRetold) -> Result<()> {
    // Added to the list as it is now: another client may have been told meanwhile.
    tx.prepare_cached(
        "UPDATE sites SET told_clients = told_clients || ?2 || ',', \
         retold = retold || ?2 || '@' || released || ',' \
         WHERE id = ?1 AND instr(told_clients, ',' || ?2 || ',') = 0",
    )?
    .execute(params![r.site, r.client])?;
    Ok(())
}
