-- latch schema: receivers that need more than a signature, and secrets sealed at rest
-- (issue #51).
--
-- clients.url_password: the password of a broker URL, sealed; `url` keeps the rest.
-- clients.headers: JSON [[name, sealed value], ...] sent on every request.
-- clients.auth: JSON {type, ...} with its secret (token, password, client_secret) sealed.
-- clients.tls: JSON {client_cert_pem, client_key_pem (sealed), ca_pem, subject, not_after,
-- ca_subject}.
-- secret_key: the id of the key new secrets are sealed under (`secrets::Keyring`); the
-- store holds ids only, never a key. Rows written before are sealed at the first start
-- (`store::sealing`), which needs the key, so SQL cannot do it here.
ALTER TABLE clients ADD COLUMN url_password TEXT;
ALTER TABLE clients ADD COLUMN headers TEXT;
ALTER TABLE clients ADD COLUMN auth TEXT;
ALTER TABLE clients ADD COLUMN tls TEXT;
CREATE TABLE secret_key (
    id INTEGER PRIMARY KEY CHECK (id = 1),
    current TEXT NOT NULL,
    since INTEGER NOT NULL
);
