"""What the demo's agents write, in the demo's language (`SAFESTOP_DEMO_LANGUAGE`, `en` or
`zh-hans`): run titles, step names, approval summaries, a steering message.

These are the agents' own words, stored as an agent stores them (the API, the ledger and the
exports hold what the agent wrote), so they are chosen when the demo seeds them, not translated
by the console when it shows them: a Chinese team's agents write Chinese titles, and the console
never rewrites what an agent said. Like the scenarios, this imports nothing from Django.

Each key is an English `str.format` template; `tests/demo` checks that every template the
scenarios use has its Simplified Chinese one here, with the same fields.
"""

from __future__ import annotations

from typing import Any

LANGUAGES = ("en", "zh-hans")

ZH_HANS: dict[str, str] = {
    # run titles
    "Answer support ticket #{ticket}": "回复客服工单 #{ticket}",
    "Send invoice reminders (batch {batch})": "发送发票催缴提醒（批次 {batch}）",
    "Revenue report {quarter}": "{quarter} 营收报告",
    "Deploy billing-api {version}": "部署 billing-api {version}",
    "Export ledger batch {export}": "导出账务批次 {export}",
    "Crawl the partner catalog": "抓取合作伙伴商品目录",
    "Summarise the quarter's supplier contracts": "汇总本季度的供应商合同",
    "Research {topic}": "调研：{topic}",
    "Sync ledger batch {batch}": "同步账务批次 {batch}",
    "Summarise incident INC-{incident}": "撰写事故 INC-{incident} 的总结",
    "Watch the on-call queue": "盯守值班队列",
    "Refund order #{order}": "为订单 #{order} 退款",
    "Release {service} {version} to production": "将 {service} {version} 发布到生产环境",
    "Email {address} about invoice {invoice}": "就发票 {invoice} 给 {address} 发邮件",
    # step names
    "Plan the answer": "规划回复",
    "Search the knowledge base": "检索知识库",
    "Read the best article": "阅读最相关的文章",
    "Draft the reply": "起草回复",
    "Post the reply to the helpdesk": "把回复发到客服系统",
    "Select overdue customers": "筛选逾期客户",
    "Send reminders": "发送提醒",
    "Plan the report": "规划报告",
    "Query the warehouse": "查询数据仓库",
    "Publish the report": "发布报告",
    "Build the release": "构建发布版本",
    "Apply database migrations": "执行数据库迁移",
    "Announce the deploy": "通告部署",
    "Export rows to the finance system": "把数据导出到财务系统",
    "Crawl pages": "抓取页面",
    "Summarise each contract": "逐份汇总合同",
    "Search until satisfied": "持续检索直到满意",
    "Sync the batch": "同步该批次",
    "Gather the timeline": "整理时间线",
    "Write the summary": "撰写总结",
    "Watch the queue": "盯守队列",
    "Poll the queue ({polls})": "轮询队列（第 {polls} 次）",
    "Page the on-call engineer": "呼叫值班工程师",
    "Check the order": "核对订单",
    "Refund the customer": "给客户退款",
    "Tell the customer": "通知客户",
    "Run the release checks": "运行发布检查",
    "Deploy to production": "部署到生产环境",
    "Watch the canary": "观察金丝雀发布",
    "Draft the email": "起草邮件",
    "Send the email": "发送邮件",
    # what a reviewer reads on an approval, a steering message, an e-mail the agent writes
    "Refund €{amount} to {customer} for returned order #{order}": (
        "为退货订单 #{order} 向 {customer} 退款 €{amount}"
    ),
    "Roll {service} {version} out to production (10% canary first)": (
        "将 {service} {version} 发布到生产环境（先 10% 金丝雀）"
    ),
    "Remind {address} that invoice {invoice} is overdue": "提醒 {address}：发票 {invoice} 已逾期",
    "Your invoice {invoice} is overdue": "您的发票 {invoice} 已逾期",
    "Hello,\n\ninvoice {invoice} is 14 days late.": "您好：\n\n发票 {invoice} 已逾期 14 天。",
    "Focus on customer impact in the EU region first.": "先关注欧盟地区的客户影响。",
}


def words(language: str, template: str, **values: Any) -> str:
    """`template` in `language` (English when it has no translation), filled with `values`."""
    chosen = ZH_HANS.get(template, template) if language == "zh-hans" else template
    return chosen.format(**values)
