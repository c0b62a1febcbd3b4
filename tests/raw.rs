//! idem's own SQL statements sent raw through sqlx, without idem: the baseline the benchmarks
//! put idem beside (`cargo bench -p idem-tests --bench ledger`, and the fleet benchmark's
//! "idem's statements without idem" engine).

use idem_runtime::ledger::Token;
use idem_runtime::ledger::sea::statements::Statements;
use sea_orm::DbBackend;
use sea_orm::sqlx;

/// A fresh random 32-byte key.
#[must_use]
pub fn random_key() -> Vec<u8> {
    let mut key = Vec::with_capacity(32);
    for _ in 0..4 {
        key.extend_from_slice(&Token::random().get().to_le_bytes());
    }
    key
}

/// idem's own statements for a first call, sent raw through sqlx on the same pool: on SQLite
/// and MariaDB the read that finds the key absent, then the claim (with a sealed label's worth
/// of bytes) and the completion (which empties the label).
///
/// # Panics
/// A statement fails.
pub async fn pair(db: &sea_orm::DatabaseConnection, statements: &'static Statements, i: u64) {
    let key = random_key();
    let token = Token::random().get() as i64;
    let now = 1_700_000_000_000 + i as i64;
    let (fp, tags, result, label) = ([7u8; 32].to_vec(), vec![1u8, 2, 3, 4], vec![b'x'; 200], vec![b'l'; 47]);
    let reads_first = db.get_database_backend() != DbBackend::Postgres;
    macro_rules! pair {
        ($pool:expr) => {{
            let pool = $pool;
            if reads_first {
                sqlx::query(sqlx::AssertSqlSafe(statements.read)).bind(key.clone()).fetch_optional(pool).await.unwrap();
            }
            sqlx::query(sqlx::AssertSqlSafe(statements.claim))
                .bind(key.clone())
                .bind(1i64)
                .bind(token)
                .bind(now)
                .bind(now + 900_000)
                .bind(now + 900_000 + 604_800_000)
                .bind(now + 30_000)
                .bind(fp)
                .bind(tags)
                .bind(2i64)
                .bind(label)
                .fetch_optional(pool)
                .await
                .unwrap();
            sqlx::query(sqlx::AssertSqlSafe(statements.complete.records.completed))
                .bind(2i16)
                .bind(result)
                .bind(Vec::<u8>::new())
                .bind(now + 60_000)
                .bind(now + 60_000)
                .bind(key)
                .bind(token)
                .execute(pool)
                .await
                .unwrap();
        }};
    }
    match db.get_database_backend() {
        DbBackend::Postgres => pair!(db.get_postgres_connection_pool()),
        DbBackend::Sqlite => pair!(db.get_sqlite_connection_pool()),
        _ => pair!(db.get_mysql_connection_pool()),
    }
}
