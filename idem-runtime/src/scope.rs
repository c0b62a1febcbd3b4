//! Whose operation is this? The authenticated [`Caller`], the [`Scope`] a key is derived in
//! (part of every key's material), and the keyed [`TenantTag`] and [`SubjectTag`] stored with
//! each record, so a status lookup by ref only ever shows a caller its own operations.

use std::fmt;

use serde_json::{Map, Value};

use crate::secret::Secret;

/// The authenticated caller of a tool: a tenant and a subject within it.
///
/// Comes from the transport's authentication (a bearer token validated by middleware, a
/// configured local identity over stdio) — never from what the model or client says about itself.
#[derive(Clone, PartialEq, Eq, Hash, Debug)]
pub struct Caller {
    tenant: String,
    subject: String,
}

impl Caller {
    /// A caller `subject` of `tenant`. See [`Caller::try_new`] for untrusted input.
    ///
    /// # Panics
    /// If either part is empty; an empty tenant would merge unrelated callers' operations.
    #[must_use]
    pub fn new(tenant: impl Into<String>, subject: impl Into<String>) -> Self {
        match Self::try_new(tenant, subject) {
            Ok(caller) => caller,
            Err(error) => panic!("{error}"),
        }
    }

    /// A caller, or an error if the tenant or subject is empty.
    pub fn try_new(tenant: impl Into<String>, subject: impl Into<String>) -> Result<Self, CallerError> {
        let (tenant, subject) = (tenant.into(), subject.into());
        if tenant.trim().is_empty() {
            return Err(CallerError::EmptyTenant);
        }
        if subject.trim().is_empty() {
            return Err(CallerError::EmptySubject);
        }
        Ok(Self { tenant, subject })
    }

    /// The tenant.
    #[must_use]
    pub fn tenant(&self) -> &str {
        &self.tenant
    }

    /// The subject within the tenant.
    #[must_use]
    pub fn subject(&self) -> &str {
        &self.subject
    }
}

/// A caller identity that cannot scope a key.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum CallerError {
    /// The tenant is empty.
    EmptyTenant,
    /// The subject is empty.
    EmptySubject,
}

impl fmt::Display for CallerError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let part = match self {
            Self::EmptyTenant => "tenant",
            Self::EmptySubject => "subject",
        };
        write!(f, "the caller's {part} is empty; authenticate the caller with a non-empty tenant and subject")
    }
}

impl std::error::Error for CallerError {}

/// The scope a key is derived in: always a tenant, usually a subject, sometimes a task id.
#[derive(Clone, PartialEq, Debug)]
pub struct Scope {
    tenant: String,
    subject: Option<String>,
    task: Option<Value>,
}

impl Scope {
    /// The caller's own scope (tenant and subject): the default.
    #[must_use]
    pub fn caller(caller: &Caller) -> Self {
        Self { tenant: caller.tenant.clone(), subject: Some(caller.subject.clone()), task: None }
    }

    /// The whole tenant: two subjects of one tenant making the same call make one operation.
    #[must_use]
    pub fn tenant(caller: &Caller) -> Self {
        Self { tenant: caller.tenant.clone(), subject: None, task: None }
    }

    /// The caller narrowed by a value of the call (`within = "conversation_id"`, [`ScopeRule::Within`](crate::ScopeRule::Within)).
    /// In the key's material it is named `task`, as it always was: renaming it would re-key.
    #[must_use]
    pub fn within(caller: &Caller, within: Value) -> Self {
        Self { tenant: caller.tenant.clone(), subject: Some(caller.subject.clone()), task: Some(within) }
    }

    /// The tenant this scope belongs to.
    #[must_use]
    pub fn tenant_name(&self) -> &str {
        &self.tenant
    }

    /// The subject this scope belongs to, or `None` for the whole tenant.
    #[must_use]
    pub fn subject_name(&self) -> Option<&str> {
        self.subject.as_deref()
    }

    /// The tag stored with records for tenant-scoped status lookups, keyed with `secret`.
    #[must_use]
    pub fn tenant_tag(&self, secret: &Secret) -> TenantTag {
        TenantTag::of(secret, &self.tenant)
    }

    /// Whose records made in this scope are: the subject's ([`SubjectTag::of`]), or the whole
    /// tenant's ([`SubjectTag::TENANT`]) for a tenant-wide scope.
    #[must_use]
    pub fn subject_tag(&self, secret: &Secret) -> SubjectTag {
        match &self.subject {
            Some(subject) => SubjectTag::of(secret, &self.tenant, subject),
            None => SubjectTag::TENANT,
        }
    }

    /// Appends [`Scope::material`] in canonical form, without building the object (members in
    /// RFC 8785 order: `subject` < `task` < `tenant`).
    pub(crate) fn write_material(&self, out: &mut Vec<u8>) -> Result<(), crate::canonical::CanonicalError> {
        out.push(b'{');
        if let Some(subject) = &self.subject {
            out.extend_from_slice(b"\"subject\":");
            crate::canonical::write_canonical_str(subject, out);
            out.push(b',');
        }
        if let Some(task) = &self.task {
            out.extend_from_slice(b"\"task\":");
            crate::canonical::write_canonical(task, out)?;
            out.push(b',');
        }
        out.extend_from_slice(b"\"tenant\":");
        crate::canonical::write_canonical_str(&self.tenant, out);
        out.push(b'}');
        Ok(())
    }

    /// The scope as key material: an object with `tenant` and, when present, `subject`, `task`.
    #[must_use]
    pub fn material(&self) -> Value {
        let mut object = Map::new();
        object.insert("tenant".to_owned(), Value::String(self.tenant.clone()));
        if let Some(subject) = &self.subject {
            object.insert("subject".to_owned(), Value::String(subject.clone()));
        }
        if let Some(task) = &self.task {
            object.insert("task".to_owned(), task.clone());
        }
        Value::Object(object)
    }
}

/// A short keyed tag of a tenant, stored with each record so status lookups by ref only ever
/// see the caller's own tenant.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
pub struct TenantTag([u8; 8]);

impl TenantTag {
    /// The tag a ledger stored as [`TenantTag::as_bytes`].
    #[must_use]
    pub const fn from_bytes(bytes: [u8; 8]) -> Self {
        Self(bytes)
    }

    /// The bytes a ledger stores.
    #[must_use]
    pub const fn as_bytes(&self) -> &[u8; 8] {
        &self.0
    }

    /// The tag of `tenant` under `secret`.
    #[must_use]
    pub fn of(secret: &Secret, tenant: &str) -> Self {
        Self(secret.scope_tag(tenant, None, || {
            let digest = secret.mac("idem/v2/tenant", &[tenant.as_bytes()]);
            let mut tag = [0u8; 8];
            tag.copy_from_slice(&digest[..8]);
            tag
        }))
    }
}

/// A short keyed tag of the subject a record belongs to, stored with it so a status lookup by
/// ref only shows a caller its own operations — or, for records made with `scope = "tenant"`
/// ([`SubjectTag::TENANT`]), the tenant's.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
pub struct SubjectTag([u8; 8]);

impl SubjectTag {
    /// The tag of records visible to the whole tenant (those made under `scope = "tenant"`).
    pub const TENANT: Self = Self([0; 8]);

    /// The tag a ledger stored as [`SubjectTag::as_bytes`].
    #[must_use]
    pub const fn from_bytes(bytes: [u8; 8]) -> Self {
        Self(bytes)
    }

    /// The bytes a ledger stores.
    #[must_use]
    pub const fn as_bytes(&self) -> &[u8; 8] {
        &self.0
    }

    /// The tag of `subject` of `tenant` under `secret` (never [`SubjectTag::TENANT`]).
    #[must_use]
    pub fn of(secret: &Secret, tenant: &str, subject: &str) -> Self {
        Self(secret.scope_tag(tenant, Some(subject), || {
            let digest = secret.mac("idem/v2/subject", &[tenant.as_bytes(), b"\0", subject.as_bytes()]);
            let mut tag = [0u8; 8];
            tag.copy_from_slice(&digest[..8]);
            if tag == Self::TENANT.0 {
                tag[7] = 1;
            }
            tag
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The fast writer and the canonical form of the material object are the same bytes.
    #[test]
    fn written_material_is_the_canonical_material() {
        let caller = Caller::new("ac\"me\u{1f600}", "al\\ice\n");
        for scope in [
            Scope::caller(&caller),
            Scope::tenant(&caller),
            Scope::within(&caller, serde_json::json!({ "conv": [1, 2.5, "x"] })),
        ] {
            let mut fast = Vec::new();
            scope.write_material(&mut fast).unwrap();
            assert_eq!(fast, crate::canonical::to_canonical_vec(&scope.material()).unwrap(), "{scope:?}");
        }
    }
}
